"""The optimizer of every update (RL steps and SFT warm-ups): AdamW, fused where torch has a
fused kernel for the parameters' device (CPU, CUDA, MPS). The fused step updates each tensor in
one kernel instead of allocating parameter-sized temporaries as the default (foreach) does:
measured on the small Qwen2 preset at 128 tokens, the update's peak growth was 0.79 GiB with
foreach and 0.54 GiB fused (docs/training.md); TRL's default optimizer is fused too."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

FUSED_DEVICES = ("cpu", "cuda", "mps")
"""Device types whose AdamW torch fuses."""


def adamw(parameters: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.AdamW:
    """`torch.optim.AdamW` over `parameters`, fused where every one is a floating-point tensor
    on a device with a fused kernel (else torch's default implementation)."""
    parameters = list(parameters)
    fused = all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in parameters)
    return torch.optim.AdamW(parameters, fused=fused or None, **options)
