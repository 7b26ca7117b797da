"""A training run's episodes kept in flight, so that a restarted run goes on from them.

With `GRPOConfig.keep_in_flight`, every training episode is kept after each turn in
`output_dir/in-flight/` (`toolgym.agents.in_flight`: the environment's snapshot and the
rollout's context), under a key that names the step it plays for (`STEP.CALL.PROCESS.INDEX`)
and beside the step of the weights that had sampled it so far and a fingerprint of its row.
A step's files go once the step is learned.

`train(resume_from_checkpoint=...)` from a checkpoint of step N, in the same `output_dir`,
keeps the files of steps N and later whose tokens all came from weights no newer than N's
(the restored policy's, or older: the importance correction reads each token's own sampling
logprob, as with `max_staleness`) and forgets the rest; the steps then resume those episodes
from their last kept turn instead of playing them again. A run that does not resume starts
with an empty folder.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolgym.agents.in_flight import (
    InFlight,
    InFlightStore,
    resumable_rollout,
    resume_in_flight,
    task_fingerprint,
)
from toolgym.agents.trajectory import Trajectory

Row = dict[str, Any]


class KeptEpisodes:
    """Training episodes kept between turns in `folder`.

    Args:
        folder: Where the episodes are kept (`output_dir/in-flight`).
        weights_step: The newest step whose weights the engine holds or is being given.
        process: This process's index (several processes keep their shares apart).
    """

    def __init__(self, folder: str | Path, weights_step: Callable[[], int], process: int = 0):
        self.store = InFlightStore(folder)
        self.weights_step, self.process = weights_step, process
        self._calls: dict[int, int] = {}  # plays so far per step (dynamic sampling plays more)
        self._lock = threading.Lock()  # pipelined steps play in threads

    def start(self, resumed_step: int | None) -> None:
        """A run begins: from nothing (every kept episode is forgotten) or from a checkpoint
        of `resumed_step` (only episodes of that step or later, sampled by weights no newer
        than its, are kept)."""
        self._calls.clear()
        if resumed_step is None:
            self.store.clear()
            return
        self.store.prune(
            lambda key, kept: (
                _step_of(key) >= resumed_step and kept.meta.get("weights", 1 << 62) <= resumed_step
            )
        )

    def play(
        self, agent: Any, envs: Sequence[Any], rows: Sequence[Row], seeds: Sequence[int], step: int
    ) -> list[Trajectory]:
        """Play the episodes of `rows` for `step`, each kept after every turn; one kept by an
        interrupted run for the same step, row and seed goes on from its last kept turn."""
        with self._lock:
            call = self._calls.get(step, 0)
            self._calls[step] = call + 1
        keys = [f"{step}.{call}.{self.process}.{i}" for i in range(len(rows))]
        pairs = zip(keys, rows, seeds, strict=True)
        tasks = {key: task_fingerprint(row, seed) for key, row, seed in pairs}

        def same_task(key: str, kept: InFlight) -> bool:
            return bool(kept.meta.get("task") == tasks[key])

        kept = resume_in_flight(self.store, keys, accept=same_task)
        rollout = resumable_rollout(
            self.store,
            {id(env): key for env, key in zip(envs, keys, strict=True)},
            kept,
            meta=lambda key: {"weights": self.weights_step(), "task": tasks[key]},
        )
        return agent.run(list(envs), [dict(row) for row in rows], list(seeds), rollout_fn=rollout)

    def learned(self, step: int) -> None:
        """`step`'s episodes are learned: forget them."""
        for key in self.store.kept_keys():
            if _step_of(key) == step:
                self.store.discard(key)
        with self._lock:
            self._calls.pop(step, None)


def _step_of(key: str) -> int:
    """The step a key names (-1 for a name that names none: never kept on a restart)."""
    head = key.split(".", 1)[0]
    return int(head) if head.isdigit() else -1
