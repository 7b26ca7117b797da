"""`RLOOTrainer`: GRPO's loop with the leave-one-out baseline (REINFORCE leave-one-out)."""

from __future__ import annotations

from typing import Any

from toolgym.algorithms.config import RLOOConfig
from toolgym.algorithms.grpo import GRPOTrainer


class RLOOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose advantages are each reward minus the mean of the other valid
    members of its group, unscaled (`RLOOConfig`'s defaults). Same arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("args") is None:
            kwargs["args"] = RLOOConfig()
        super().__init__(*args, **kwargs)
