"""Prompt rows handed over as a list, as a registry dataset builder."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any


def rows_builder(dataset: Any) -> Callable[..., Any] | None:
    """`dataset` as a registry builder `f(n, seed)`: a builder as it is, a list of rows as
    draws by seed (with replacement), None as None."""
    if dataset is None or callable(dataset):
        return dataset
    rows = [dict(row) for row in dataset]

    def build(n: int, seed: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
        draw = random.Random(seed)
        return [dict(draw.choice(rows)) for _ in range(n)]

    return build
