"""Pipelined training steps: rollouts played in threads while earlier updates run.

The rollouts of step n start once the engine holds the weights of update n - max_staleness,
so no sample is more than `max_staleness` updates old when it is learned from. The producer
thread only starts plays (the sampler); the caller's thread only learns (the learner), step
by step in order. With `overlap` (`GRPOConfig.partial_rollouts`) a step's play starts as soon
as the bound lets it, beside the plays of earlier steps still finishing their slowest
episodes (at most `max_staleness` + 1 at once); without it, one play at a time, so a step's
episodes start only once every episode of the step before has ended.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from toolgym.algorithms.sampler import Rollouts


class _Producer:
    """Starts each step's play once the engine is close enough behind, in the order of the
    steps; the learner takes the plays in that order (`next`) and says when it has updated
    (`updated`)."""

    def __init__(
        self,
        steps: range,
        max_staleness: int,
        engine_version: Callable[[], int],
        play: Callable[[int], Rollouts | str],
        overlap: bool,
    ) -> None:
        self.steps, self.max_staleness = steps, max_staleness
        self.engine_version, self.play = engine_version, play
        self.plays: queue.Queue[Future[Rollouts | str] | BaseException] = queue.Queue()
        self.condition = threading.Condition()
        self.stop = threading.Event()
        self.players = ThreadPoolExecutor(
            max_staleness + 1 if overlap else 1, thread_name_prefix="toolgym-rollouts"
        )
        self.thread = threading.Thread(target=self._produce, name="toolgym-producer", daemon=True)
        self.thread.start()

    def next(self) -> Rollouts | str:
        """The next step's rollouts (or why it was not played), once played."""
        played = self.plays.get()
        if isinstance(played, BaseException):
            raise played
        return played.result()  # a play that raised raises here

    def updated(self) -> None:
        """The learner updated: the engine's version may let another play start."""
        with self.condition:
            self.condition.notify_all()

    def close(self) -> None:
        """Start no more plays; wait for those started (queued ones are dropped)."""
        self.stop.set()
        self.updated()
        self.thread.join()
        self.players.shutdown(wait=True, cancel_futures=True)

    def _caught_up(self, step: int) -> bool:
        return self.engine_version() >= step - self.max_staleness or self.stop.is_set()

    def _play(self, step: int) -> Rollouts | str:
        batch = self.play(step)
        if isinstance(batch, str):  # the learner stops at this step: start no more
            self.stop.set()
            self.updated()
        return batch

    def _produce(self) -> None:
        try:
            for step in self.steps:
                with self.condition:  # the engine has the weights of that update
                    self.condition.wait_for(functools.partial(self._caught_up, step))
                if self.stop.is_set():
                    return
                self.plays.put(self.players.submit(self._play, step))
        except BaseException as error:  # handed to the learner, which raises it
            self.plays.put(error)


def pipelined_steps(
    steps: range,
    max_staleness: int,
    engine_version: Callable[[], int],
    play: Callable[[int], Rollouts | str],
    learn: Callable[[Rollouts], dict[str, Any]],
    keep_going: Callable[[], bool],
    budget_spent: Callable[[str], None],
    overlap: bool = False,
) -> Iterator[dict[str, Any]]:
    """Each step's metrics, learning from rollouts played ahead in threads.

    Args:
        steps: The steps to play (the producer's range).
        max_staleness: How many updates a step's rollouts may lag behind.
        engine_version: The step whose weights the engine holds now.
        play: A step's rollouts, or why it is not worth playing (a spent time budget).
        learn: The update on one step's rollouts; its metrics.
        keep_going: Whether the learner starts another step.
        budget_spent: Told why the producer stopped early.
        overlap: Let the plays of up to `max_staleness` + 1 steps run at once.
    """
    producer = _Producer(steps, max_staleness, engine_version, play, overlap)
    try:
        while keep_going():
            batch = producer.next()
            if isinstance(batch, str):
                budget_spent(batch)
                break
            metrics = learn(batch)
            producer.updated()
            yield metrics
    finally:
        producer.close()
