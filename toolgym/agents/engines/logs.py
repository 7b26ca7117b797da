"""Keep a terminal readable: the generation engine's log lines go to a file.

vLLM logs every start-up setting and, on the CPU, a warning on every generate call; model
loading and saving draw progress bars. A person watching a run wants the stages, the progress
bar and the results. `engine_logs_to_file(path)` sends vLLM's log records and the Python
warnings raised in its modules to `path` and turns off transformers' loading/saving progress
bars; `engine_logs_to_terminal()` undoes it. `GRPOTrainer` calls one of them
(`GRPOConfig.verbose`).
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

ENGINE_LOGGERS = ("vllm",)
"""Loggers whose records go to the file (with their child loggers)."""

_SHOW_WARNING = warnings.showwarning


def engine_logs_to_file(path: str | Path) -> Path:
    """Send the engine loggers' records (INFO and up) and the warnings raised in vLLM's
    modules to `path` (appended), instead of the terminal, and hide transformers' progress
    bars. Errors still reach the program as exceptions. Calling it again with the same path
    does nothing; with another path, the lines go there from then on."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    # a vLLM imported later leaves its logger to us; one imported before is rewired below
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    for name in ENGINE_LOGGERS:
        _to_file(logging.getLogger(name), path)
    warnings.showwarning = _engine_warnings_to_log
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    return path


def engine_logs_to_terminal() -> None:
    """Undo `engine_logs_to_file`: records propagate to the root logger again (the terminal),
    warnings show as usual, and progress bars are back."""
    for name in ENGINE_LOGGERS:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, logging.FileHandler)]:
            logger.removeHandler(handler)
            handler.close()
        logger.propagate = True
    warnings.showwarning = _SHOW_WARNING
    from transformers.utils import logging as transformers_logging

    transformers_logging.enable_progress_bar()


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


def _engine_warnings_to_log(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning` that sends the warnings of vLLM's modules to its log file."""
    if f"{os.sep}vllm{os.sep}" in filename:
        logging.getLogger("vllm.warnings").warning(
            "%s:%s: %s: %s", filename, lineno, category.__name__, message
        )
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)
