"""Checkpoints that resume a run exactly: weights, optimizer, schedule, RNG and step."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file


def save_checkpoint(
    folder: str | Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
) -> Path:
    """Write `folder` with the model (save_pretrained), tokenizer, optimizer, scheduler, the
    random states of python / numpy / torch, and the step."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    rng = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    torch.save(rng, folder / "rng.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
    return folder


def load_checkpoint(
    folder: str | Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any
) -> int:
    """Restore what `save_checkpoint` wrote into live objects; returns the step."""
    folder = Path(folder)
    if not (folder / "trainer_state.json").exists():
        raise FileNotFoundError(f"{folder} is not a toolgym checkpoint (no trainer_state.json)")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    _load_weights(model, state)
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
    rng = torch.load(folder / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return int(json.loads((folder / "trainer_state.json").read_text())["step"])


def _load_weights(model: Any, state: dict[str, torch.Tensor]) -> None:
    if hasattr(model, "load_adapter") and any("lora" in k for k in state):  # peft adapters
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state)
        return
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"checkpoint does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
