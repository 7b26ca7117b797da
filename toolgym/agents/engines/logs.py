"""Keep a terminal readable: the generation engine's log lines go to a file.

vLLM logs every start-up setting and, on the CPU, a warning on every generate call; model
loading and saving draw progress bars. A person watching a run wants the stages, the progress
bar and the results. `engine_logs_to_file(path)` sends vLLM's log records and its Python
warnings to `path` and turns off transformers' loading/saving progress bars; `GRPOTrainer`
calls it unless `GRPOConfig.verbose`.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

ENGINE_LOGGERS = ("vllm",)
"""Loggers whose records go to the file (with their child loggers)."""


def engine_logs_to_file(path: str | Path) -> Path:
    """Send the engine loggers' records (every level) and warnings raised in vLLM's modules to
    `path` (appended), instead of the terminal, and hide transformers' progress bars. Errors
    still reach the program as exceptions. Calling it again with the same path does nothing."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    # a vLLM imported later leaves its logger to us; one imported before is rewired below
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    for name in ENGINE_LOGGERS:
        _to_file(logging.getLogger(name), path)
    warnings.filterwarnings("ignore", module=r"vllm(\.|$)")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    return path


def _to_file(logger: logging.Logger, path: Path) -> None:
    if any(getattr(h, "baseFilename", None) == str(path) for h in logger.handlers):
        return
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        if isinstance(handler, logging.FileHandler):  # an earlier run's file
            handler.close()
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)  # made on the first line
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)  # vLLM's own default: start-up settings are worth keeping
