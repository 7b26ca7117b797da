"""A cache of warm-up results, so a second run with the same starting point skips the warm-up.

The key hashes everything the warmed weights depend on: the starting weights (every tensor's
bytes), the demonstrations' tokens and loss masks, the `SFTConfig`, and the torch version. An
entry is a folder named by the key holding the warmed weights (`model.safetensors`, tied
weights handled) and the step losses (`losses.json`); it is written to a temporary folder and
renamed, so an interrupted run never leaves a half-written entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.config import SFTConfig

FORMAT = 1


def default_cache_dir() -> Path:
    """`$TOOLGYM_CACHE`, else `$XDG_CACHE_HOME/toolgym`, else `~/.cache/toolgym`."""
    if os.environ.get("TOOLGYM_CACHE"):
        return Path(os.environ["TOOLGYM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "toolgym"


def warmup_key(model: Any, demos: Sequence[Trajectory], config: SFTConfig) -> str:
    """A digest of the starting weights, the demonstrations and the settings."""
    digest = hashlib.blake2b(digest_size=16)
    header = {"format": FORMAT, "torch": torch.__version__, "config": dataclasses.asdict(config)}
    digest.update(json.dumps(header, sort_keys=True).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    for trajectory in demos:
        for sample in trajectory.samples():
            for part in (sample.prompt_ids, sample.completion_ids, sample.loss_mask):
                digest.update(json.dumps(part).encode())
    return digest.hexdigest()


def load_warmup(folder: Path, key: str, model: Any) -> list[float] | None:
    """Load the cached warmed weights into `model` and return the losses; None on a miss."""
    entry = folder / "warmup" / key
    if not (entry / "losses.json").is_file():
        return None
    from safetensors.torch import load_model

    load_model(model, str(entry / "model.safetensors"))
    return json.loads((entry / "losses.json").read_text())


def store_warmup(folder: Path, key: str, model: Any, losses: list[float]) -> Path:
    """Save the warmed weights and losses under `key` (replacing an older entry)."""
    from safetensors.torch import save_model

    parent = folder / "warmup"
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=".partial-"))
    try:
        save_model(model, str(staging / "model.safetensors"))
        (staging / "losses.json").write_text(json.dumps(losses))
        entry = parent / key
        shutil.rmtree(entry, ignore_errors=True)
        staging.rename(entry)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return entry
