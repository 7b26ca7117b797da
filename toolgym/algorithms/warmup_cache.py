"""A cache of warm-up results, so a second run with the same starting point skips the warm-up.

The key hashes everything the warmed weights depend on: the starting weights (every tensor's
bytes) and the model's configuration, the demonstrations' tokens and loss masks (sample by
sample), the `SFTConfig` (less `micro_batch_size`, `logprob_chunk_size` and `share_prefix`,
which change memory and speed, not the result beyond rounding), the device type, and the
torch and transformers versions. An entry is a folder named by the key holding the warmed
weights (`model.safetensors`, tied weights handled) and the step losses (`losses.json`). It is
written to a temporary folder and renamed; a run that finds the entry already there (another
run stored the same result first) keeps that one, and an entry that cannot be read counts as a
miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from toolgym.agents.models import cache_dir
from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.config import SFTConfig
from toolgym.runtime.stages import StageClock

FORMAT = 1


def default_cache_dir() -> Path:
    """toolgym's cache folder (`toolgym.agents.models.cache_dir`)."""
    return cache_dir()


def warmup_key(model: Any, demos: Sequence[Trajectory], config: SFTConfig) -> str:
    """A digest of the starting weights, the demonstrations and the settings."""
    import transformers

    digest = hashlib.blake2b(digest_size=16)
    settings = dataclasses.asdict(config)
    settings.pop("micro_batch_size")
    settings.pop("logprob_chunk_size")
    settings.pop("share_prefix")
    header = {
        "format": FORMAT,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": next(model.parameters()).device.type,
        "model": model.config.to_dict() if hasattr(model, "config") else type(model).__name__,
        "config": settings,
    }
    digest.update(json.dumps(header, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    for trajectory in demos:
        samples = [
            [sample.prompt_ids, sample.completion_ids, sample.loss_mask]
            for sample in trajectory.samples
        ]
        digest.update(json.dumps(samples).encode())
    return digest.hexdigest()


def load_warmup(folder: Path, key: str, model: Any) -> list[float] | None:
    """Load the cached warmed weights into `model` and return the losses; None on a miss
    (no entry, or one that cannot be read)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    entry = folder / "warmup" / key
    try:
        losses = json.loads((entry / "losses.json").read_text())
        load_model(model, str(entry / "model.safetensors"))
    except (OSError, ValueError, SafetensorError):
        if entry.is_dir():  # unreadable: make room for a good one
            shutil.rmtree(entry, ignore_errors=True)
        return None
    return losses


def store_warmup(folder: Path, key: str, model: Any, losses: list[float]) -> Path:
    """Save the warmed weights and losses under `key`, unless an entry is already there (the
    same key stands for the same result)."""
    from safetensors.torch import save_model

    parent = folder / "warmup"
    entry = parent / key
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=".partial-"))
    try:
        save_model(model, str(staging / "model.safetensors"))
        (staging / "losses.json").write_text(json.dumps(losses))
        staging.rename(entry)
    except OSError:
        if not entry.is_dir():  # not a lost race with an identical store
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def cached_warmup(
    train: Callable[[], list[float]],
    policy: Any,
    demos: Sequence[Trajectory],
    config: SFTConfig,
    cache_dir: Path | None,
    stages: StageClock,
) -> tuple[list[float], Path | None]:
    """The warm-up's step losses: `train()` run on `policy`, or its result loaded from
    `cache_dir` when an entry for the same start, demonstrations and settings is there (a
    new result is stored); also the entry that was loaded (None when `train` ran)."""
    if cache_dir is None:
        with stages.stage("warm-up"):
            return train(), None
    with stages.stage("warm-up cache"):
        key = warmup_key(policy, demos, config)
        losses = load_warmup(cache_dir, key, policy)
    if losses is not None:
        return losses, cache_dir / "warmup" / key
    with stages.stage("warm-up"):
        losses = train()
    with stages.stage("warm-up cache"):
        store_warmup(cache_dir, key, policy, losses)
    return losses, None
