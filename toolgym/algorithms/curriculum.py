"""A difficulty curriculum: train where the policy succeeds sometimes, not always or never.

Rows declare their difficulty in a `difficulty` column (any numbers; lower is easier), as an
environment's dataset builder writes it. With `GRPOConfig.curriculum=True` each step's rows
come from one level only, starting at the easiest. After each step the level's success rate
(episodes whose reward reached `success_threshold`) joins a window of the last
`curriculum_window` steps at that level; when the window is full and its mean reaches
`curriculum_promote_at` the next level opens, and at or below `curriculum_demote_at` the
previous one returns (the window starts over at each move). Rows of a level are drawn in a
seeded shuffle of their own, so a resumed run, whose checkpoint keeps the curriculum's state,
draws what the uninterrupted one would.

Anchor: prime-rl's difficulty pools sort rows by their measured rewards; here the environment
says what is harder, and the measured rate chooses how hard to train.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Row = dict[str, Any]


@dataclass
class Curriculum:
    """The curriculum's state and its rules (see the module docstring)."""

    rows: Sequence[Row]
    window: int = 3
    promote_at: float = 0.6
    demote_at: float = 0.1
    seed: int = 0
    level: int = 0
    """Index into `levels` of the level now trained."""
    recent: list[float] = field(default_factory=list)
    """The success rates of the last steps at this level (at most `window`)."""
    drawn: dict[int, int] = field(default_factory=dict)
    """Rows drawn so far per level index (their position in the level's shuffles)."""
    moves: int = 0

    def __post_init__(self) -> None:
        missing = [i for i, row in enumerate(self.rows) if "difficulty" not in row]
        if missing:
            raise ValueError(
                f"curriculum=True needs a `difficulty` column in every row; rows {missing[:5]} "
                f"have none (of {len(self.rows)})"
            )
        if not 0 <= self.demote_at < self.promote_at <= 1:
            raise ValueError(
                "curriculum thresholds need 0 <= curriculum_demote_at < curriculum_promote_at "
                f"<= 1, got {self.demote_at} and {self.promote_at}"
            )
        if self.window < 1:
            raise ValueError("curriculum_window must be at least 1")
        # pipelined steps draw in the rollout thread while the learner observes
        self._lock = threading.RLock()
        self.levels = sorted({float(row["difficulty"]) for row in self.rows})
        self._by_level = [
            [i for i, row in enumerate(self.rows) if float(row["difficulty"]) == level]
            for level in self.levels
        ]

    @property
    def difficulty(self) -> float:
        """The difficulty value of the level now trained."""
        return self.levels[self.level]

    def draw(self, count: int) -> list[Row]:
        """The next `count` rows of the current level (its seeded shuffles, one after another)."""
        with self._lock:
            return self._draw(count)

    def _draw(self, count: int) -> list[Row]:
        indices = self._by_level[self.level]
        start = self.drawn.get(self.level, 0)
        picked = []
        for position in range(start, start + count):
            epoch, offset = divmod(position, len(indices))
            order = list(indices)
            random.Random(f"toolgym-curriculum:{self.seed}:{self.level}:{epoch}").shuffle(order)
            picked.append(dict(self.rows[order[offset]]))
        self.drawn[self.level] = start + count
        return picked

    def observe(self, success_rate: float) -> None:
        """Add a step's success rate at the current level; promote or demote by the window."""
        with self._lock:
            self._observe(success_rate)

    def _observe(self, success_rate: float) -> None:
        self.recent = [*self.recent, success_rate][-self.window :]
        if len(self.recent) < self.window:
            return
        mean = statistics.fmean(self.recent)
        if mean >= self.promote_at and self.level + 1 < len(self.levels):
            self._move(+1)
        elif mean <= self.demote_at and self.level > 0:
            self._move(-1)

    def _move(self, by: int) -> None:
        self.level += by
        self.recent = []
        self.moves += 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON-ready)."""
        return {
            "level": self.level,
            "recent": list(self.recent),
            "drawn": {str(k): v for k, v in self.drawn.items()},
            "moves": self.moves,
            "levels": self.levels,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s values (the rows' levels must be the same)."""
        if [float(x) for x in state["levels"]] != self.levels:
            raise ValueError(
                f"the checkpoint's curriculum has levels {state['levels']}, these rows have "
                f"{self.levels}: resume with the same dataset"
            )
        self.level = int(state["level"])
        self.recent = [float(x) for x in state["recent"]]
        self.drawn = {int(k): int(v) for k, v in state["drawn"].items()}
        self.moves = int(state["moves"])


STATE_FILE = "curriculum.json"
"""The curriculum's state in a checkpoint folder."""


def save_curriculum(curriculum: Curriculum | None, folder: str | Path) -> None:
    """Write the curriculum's state into a checkpoint folder (nothing without one)."""
    if curriculum is not None:
        (Path(folder) / STATE_FILE).write_text(json.dumps(curriculum.state_dict()))


def load_curriculum(curriculum: Curriculum | None, folder: str | Path) -> None:
    """Restore the curriculum's state from a checkpoint folder; a checkpoint of a run without
    a curriculum starts it at the easiest level, with a warning."""
    if curriculum is None:
        return
    path = Path(folder) / STATE_FILE
    if not path.exists():
        warnings.warn(
            f"{folder} holds no curriculum state (its run had curriculum=False): the "
            "curriculum starts at the easiest level",
            stacklevel=2,
        )
        return
    curriculum.load_state_dict(json.loads(path.read_text()))
