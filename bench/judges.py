"""What a judge costs beyond its model (issue 47 item 1): `Judge` over a scripted model that
answers after `--delay` seconds, judging `--episodes` episodes pointwise with a two-criterion
rubric (no cache: every episode is a call). The peer is the model alone at the same bound:
episodes x delay / max_concurrency, the least time those calls can take. Printed per
bound: seconds, episodes judged per second, the ratio to the peer, and the most calls that
were in flight.

    python bench/judges.py                     # 0 and 50 ms models, bounds 4 and 16
    python bench/judges.py --episodes 40
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolgym.agents.trajectory import Trajectory
from toolgym.judges import Criterion, Judge, Rubric

RUBRIC = Rubric(
    criteria=(
        Criterion("correct", "The city named is the capital asked for.", weight=3),
        Criterion("brief", "One short sentence."),
    )
)


class ScriptedModel:
    """A judge model that answers a fixed score after `delay` seconds; counts calls in flight."""

    name = "scripted"

    def __init__(self, delay: float) -> None:
        self.delay, self.live, self.most_live = delay, 0, 0
        self.lock = threading.Lock()

    async def complete(self, messages: Any) -> str:
        with self.lock:
            self.live += 1
            self.most_live = max(self.most_live, self.live)
        try:
            await asyncio.sleep(self.delay)
            return "correct: 10\nbrief: 8"
        finally:
            with self.lock:
                self.live -= 1


def episode(index: int) -> Trajectory:
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": f"Paris ({index})."},
    ]
    return Trajectory(messages=messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=160)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--bounds", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args()
    episodes = [episode(i) for i in range(args.episodes)]
    for delay in args.delays:
        for bound in args.bounds:
            model = ScriptedModel(delay)
            judge = Judge(model, RUBRIC, max_concurrency=bound, cache=False)
            started = time.perf_counter()
            values = asyncio.run(judge(episodes))
            seconds = time.perf_counter() - started
            assert all(v is not None for v in values), "a scripted judge call failed"
            peer = len(episodes) * delay / bound
            ratio = f"{seconds / peer:.2f}x the model alone" if peer else "no model time"
            print(
                f"model {delay * 1000:.0f} ms, max_concurrency {bound}: {len(episodes)} "
                f"episodes in {seconds:.2f} s, {len(episodes) / seconds:.0f} judged/s "
                f"({seconds / len(episodes) * 1000:.2f} ms each), {ratio}, "
                f"most in flight {model.most_live}"
            )


if __name__ == "__main__":
    main()
