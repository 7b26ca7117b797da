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
    plays: queue.Queue[Future[Rollouts | str] | BaseException] = queue.Queue()
    updated = threading.Condition()
    stop = threading.Event()
    players = ThreadPoolExecutor(
        max_staleness + 1 if overlap else 1, thread_name_prefix="toolgym-rollouts"
    )

    def engine_caught_up(step: int) -> bool:
        return engine_version() >= step - max_staleness or stop.is_set()

    def play_step(step: int) -> Rollouts | str:
        batch = play(step)
        if isinstance(batch, str):  # the learner stops at this step: start no more
            stop.set()
            with updated:
                updated.notify_all()
        return batch

    def produce() -> None:
        try:
            for step in steps:
                with updated:  # the engine has the weights of that update
                    updated.wait_for(functools.partial(engine_caught_up, step))
                if stop.is_set():
                    return
                plays.put(players.submit(play_step, step))
        except BaseException as error:  # handed to the learner, which raises it
            plays.put(error)

    producer = threading.Thread(target=produce, name="toolgym-producer", daemon=True)
    producer.start()
    try:
        while keep_going():
            played = plays.get()
            if isinstance(played, BaseException):
                raise played
            batch = played.result()  # a play that raised raises here
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
        players.shutdown(wait=True, cancel_futures=True)  # plays started end; queued ones go
