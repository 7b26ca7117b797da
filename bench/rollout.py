"""Rollout throughput and framework overhead of toolgym's agent loop.

Plays Wordle episodes with a model that calls tools every turn (a tiny model trained for a few
steps on a scripted game, so the figures exercise multi-turn tool use), with tools that answer
at once and tools that sleep 50 ms, and prints:

- episodes/s and model tokens/s;
- framework overhead: the share of wall time in which neither the engine is generating nor any
  tool is running (union of intervals, as episodes overlap). Target: under 3%.

    python bench/rollout.py [--episodes 32] [--engine hf|vllm]

Comparison with TRL's GRPOTrainer generation path is not in this script yet (see the notes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import toolgym
from toolgym.agents import Agent, AgentLimits, HFEngine, SamplingParams
from toolgym.envs.wordle import Wordle
from toolgym.testing import tiny_tokenizer

Interval = tuple[float, float]


class Intervals:
    """Thread-safe record of busy intervals."""

    def __init__(self) -> None:
        self.spans: list[Interval] = []
        self._lock = threading.Lock()

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self.spans.append((start, end))


def union_length(spans: list[Interval]) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(spans):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


class TimedEngine:
    """Records the interval of every generate() call of the wrapped engine."""

    def __init__(self, engine, busy: Intervals) -> None:
        self.engine, self.busy = engine, busy
        self.context_length = engine.context_length

    def generate(self, requests):
        start = time.perf_counter()
        try:
            return self.engine.generate(requests)
        finally:
            self.busy.add(start, time.perf_counter())

    def update_weights(self, weights) -> None:
        self.engine.update_weights(weights)

    def close(self) -> None:
        self.engine.close()


def timed_wordle(busy: Intervals, delay: float) -> type[Wordle]:
    class TimedWordle(Wordle):
        def guess(self, word: str) -> str:
            """Guess the secret word and get a colour for each letter.

            Args:
                word: A five-letter English word.
            """
            start = time.perf_counter()
            try:
                if delay:
                    time.sleep(delay)
                return super().guess(word)
            finally:
                busy.add(start, time.perf_counter())

    return TimedWordle


def run(engine_name: str, episodes: int, delay: float, tokenizer, folder: str, model) -> None:
    busy = Intervals()
    if engine_name == "vllm":
        from toolgym.agents import VLLMEngine

        base = VLLMEngine(folder, context_length=2048, dtype="float32")
    else:
        base = HFEngine(model, tokenizer)
    engine = TimedEngine(base, busy)
    agent = Agent(
        engine,
        tokenizer,
        parser="hermes",
        sampling=SamplingParams(temperature=0),
        limits=AgentLimits(max_turns=6, max_new_tokens=40),
    )
    env_class = timed_wordle(busy, delay)
    rows = [{**r, "answer": "crane"} for r in toolgym.spec("Wordle-v0").dataset(episodes, seed=0)]
    agent.run([env_class()], rows[:1])  # warm-up
    busy.spans.clear()
    started = time.perf_counter()
    trajectories = agent.run([env_class() for _ in rows], rows)
    wall = time.perf_counter() - started
    tokens = sum(sum(t.loss_mask) for t in trajectories)
    turns = sum(t.metrics["turns"] for t in trajectories)
    overhead = 1 - union_length(busy.spans) / wall
    print(
        f"{engine_name:5} tools {delay * 1000:3.0f} ms | {episodes} episodes, {turns:.0f} turns, "
        f"{wall:6.2f} s | {episodes / wall:6.2f} episodes/s | "
        f"{tokens / wall:7.1f} model tokens/s | framework overhead {overhead:5.1%}"
    )
    base.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()
    from helpers import train_tool_caller

    tokenizer = tiny_tokenizer()
    model = train_tool_caller(tokenizer, hidden_size=128)
    folder = tempfile.mkdtemp(prefix="toolgym-bench-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for delay in (0.0, 0.05):
        run(args.engine, args.episodes, delay, tokenizer, folder, model)


if __name__ == "__main__":
    main()
