"""Checkpoints that resume a run exactly: weights, optimizer, schedule, RNG and step."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from toolgym.algorithms.sharding import is_sharded, load_full_optimizer_state, load_full_weights


def save_checkpoint(
    folder: str | Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    weights: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write `folder` with the model (save_pretrained), tokenizer, optimizer, scheduler, this
    process's random states (`rng-0.pt`) and the step. Other processes of a distributed run
    add their own random states with `save_random_states`. `weights` and `optimizer_state`
    replace the model's and optimizer's own (a sharded policy's full ones, `sharding`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # (a copy: save_pretrained empties the dict it is given)
    model.save_pretrained(folder, **({} if weights is None else {"state_dict": dict(weights)}))
    tokenizer.save_pretrained(folder)
    state = optimizer.state_dict() if optimizer_state is None else optimizer_state
    torch.save(state, folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    save_random_states(folder, 0)
    (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
    return folder


def save_random_states(folder: str | Path, rank: int) -> None:
    """The python / numpy / torch (and CUDA) random states of this process, as
    `rng-{rank}.pt`, in plain types and tensors only (loadable with `weights_only=True`)."""
    version, internal, gauss = random.getstate()
    state: Any = np.random.get_state(legacy=True)
    kind, keys, position, has_gauss, cached = state
    states = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():  # sampling on a GPU draws from the CUDA generators
        states["cuda"] = torch.cuda.get_rng_state()  # this process's device
    Path(folder).mkdir(parents=True, exist_ok=True)
    torch.save(states, Path(folder) / f"rng-{rank}.pt")


def load_checkpoint(
    folder: str | Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int = 0,
) -> int:
    """Restore what `save_checkpoint` wrote into live objects (the random states of process
    `rank`); returns the step. Nothing is unpickled: every file loads with
    `weights_only=True`."""
    folder = Path(folder)
    if not (folder / "trainer_state.json").exists():
        raise FileNotFoundError(f"{folder} is not a toolgym checkpoint (no trainer_state.json)")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    optimizer_state = torch.load(folder / "optimizer.pt", weights_only=True)
    _load_weights(model, state)
    if is_sharded(model):  # full tensors into every process's slices
        load_full_optimizer_state(model, optimizer, optimizer_state)
    else:
        if any(isinstance(key, str) for key in optimizer_state.get("state", {})):
            raise ValueError(
                f"{folder}'s optimizer state was saved by an FSDP run (keyed by parameter "
                "name); resume it with FSDP"
            )
        optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    rng_file = folder / f"rng-{rank}.pt"
    if not rng_file.exists():
        why = (
            "it was saved by an earlier toolgym (rng.pt, which held the main process's states "
            "only and loads only by unpickling); resume it with that version"
            if (folder / "rng.pt").exists()
            else "it was saved by a run with fewer processes"
        )
        raise FileNotFoundError(f"{folder} has no random states for process {rank}: {why}")
    states = torch.load(rng_file, weights_only=True)
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
    return int(json.loads((folder / "trainer_state.json").read_text())["step"])


def _load_weights(model: Any, state: dict[str, torch.Tensor]) -> None:
    if hasattr(model, "load_adapter") and any("lora" in k for k in state):  # peft adapters
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state)
        return
    if is_sharded(model):  # full tensors into every process's slices
        missing, unexpected = load_full_weights(model, state)
    else:
        missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"checkpoint does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
