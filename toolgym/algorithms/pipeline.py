"""Pipelined training steps: rollouts played in a thread while earlier updates run.

The rollouts of step n start once the engine holds the weights of update n - max_staleness,
so no sample is more than `max_staleness` updates old when it is learned from. The producer
thread only plays (the sampler); the caller's thread only learns (the learner).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from toolgym.algorithms.sampler import Rollouts


def pipelined_steps(
    steps: range,
    max_staleness: int,
    engine_version: Callable[[], int],
    play: Callable[[int], Rollouts | str],
    learn: Callable[[Rollouts], dict[str, Any]],
    keep_going: Callable[[], bool],
    budget_spent: Callable[[str], None],
) -> Iterator[dict[str, Any]]:
    """Each step's metrics, learning from rollouts played ahead in a thread.

    Args:
        steps: The steps to play (the producer's range).
        max_staleness: How many updates a step's rollouts may lag behind.
        engine_version: The step whose weights the engine holds now.
        play: A step's rollouts, or why it is not worth playing (a spent time budget).
        learn: The update on one step's rollouts; its metrics.
        keep_going: Whether the learner starts another step.
        budget_spent: Told why the producer stopped early.
    """
    batches: queue.Queue[Rollouts | BaseException | str] = queue.Queue()
    updated = threading.Condition()
    stop = threading.Event()

    def engine_caught_up(step: int) -> bool:
        return engine_version() >= step - max_staleness or stop.is_set()

    def produce() -> None:
        try:
            for step in steps:
                with updated:  # the engine has the weights of that update
                    updated.wait_for(functools.partial(engine_caught_up, step))
                if stop.is_set():
                    return
                batch = play(step)
                batches.put(batch)
                if isinstance(batch, str):  # the learner stops here
                    return
        except BaseException as error:  # handed to the learner, which raises it
            batches.put(error)

    producer = threading.Thread(target=produce, name="toolgym-rollouts", daemon=True)
    producer.start()
    try:
        while keep_going():
            batch = batches.get()
            if isinstance(batch, BaseException):
                raise batch
            if isinstance(batch, str):
                budget_spent(batch)
                break
            metrics = learn(batch)
            with updated:
                updated.notify_all()
            yield metrics
    finally:
        stop.set()
        with updated:
            updated.notify_all()
        producer.join()
