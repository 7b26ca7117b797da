"""Rollout throughput and framework overhead of toolgym's agent loop.

Plays Wordle episodes with a model that calls tools every turn (a tiny model trained for a few
steps on a scripted game, so the figures exercise multi-turn tool use), with tools that answer
at once and tools that sleep 50 ms, and prints:

- episodes/s and model tokens/s (median of 5 batches after a warm-up batch);
- framework overhead: the share of wall time in which neither the engine is generating nor any
  tool is running (union of intervals, as episodes overlap). Target: under 3%.

and, with `--engine hf`, the same figures for TRL's GRPOTrainer generation path with
`environment_factory` (bench/trl_peer.py; trl is installed into `.bench/site` on first use), on
the same model, tokenizer, chat template (the Qwen2.5 template trl ships, which TRL requires),
episodes and limits, measured in the same run, and toolgym's throughput as a multiple of TRL's.

    python bench/rollout.py [--episodes 32] [--engine hf|vllm] [--no-peer]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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


MAX_TURNS, MAX_NEW_TOKENS = 6, 40
REPEATS = 5  # each figure is the median of this many batches, after one warm-up batch


def wordle_rows(episodes: int) -> list[dict]:
    return [{**r, "answer": "crane"} for r in toolgym.spec("Wordle-v0").dataset(episodes, seed=0)]


def run(engine_name: str, episodes: int, delay: float, tokenizer, folder: str, model) -> float:
    """Play `episodes` games with toolgym, print the figures, return episodes/s."""
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
        limits=AgentLimits(max_turns=MAX_TURNS, max_new_tokens=MAX_NEW_TOKENS),
    )
    env_class = timed_wordle(busy, delay)
    rows = wordle_rows(episodes)
    agent.run([env_class() for _ in rows], rows)  # warm-up
    walls, overheads = [], []
    for _ in range(REPEATS):
        busy.spans.clear()
        started = time.perf_counter()
        trajectories = agent.run([env_class() for _ in rows], rows)
        walls.append(time.perf_counter() - started)
        overheads.append(1 - union_length(busy.spans) / walls[-1])
    wall, overhead = statistics.median(walls), statistics.median(overheads)
    tokens = sum(sum(t.loss_mask) for t in trajectories)
    calls = sum(t.metrics["tool_calls"] for t in trajectories)
    reward = sum(t.reward for t in trajectories) / episodes
    print(
        f"toolgym {engine_name:4} tools {delay * 1000:3.0f} ms | {episodes} episodes, "
        f"{calls:.0f} tool calls, reward {reward:.2f}, {wall:6.2f} s | "
        f"{episodes / wall:6.2f} episodes/s | "
        f"{tokens / wall:7.1f} model tokens/s | framework overhead {overhead:5.1%}"
    )
    base.close()
    return episodes / wall


def run_trl(episodes: int, delay: float, tokenizer, model) -> float:
    """Play the same games through TRL's generation path, print the figures, return episodes/s."""
    from trl_peer import trl_rollout

    figures = trl_rollout(
        model,
        tokenizer,
        wordle_rows(episodes),
        timed_wordle(Intervals(), delay),
        max_turns=MAX_TURNS,
        max_new_tokens=MAX_NEW_TOKENS,
        repeats=REPEATS,
    )
    wall = figures["wall"]
    print(
        f"TRL     hf   tools {delay * 1000:3.0f} ms | {episodes} episodes, "
        f"{figures['tool_calls']:.0f} tool calls, reward {figures['reward']:.2f}, "
        f"{wall:6.2f} s | {episodes / wall:6.2f} episodes/s | "
        f"{figures['model_tokens'] / wall:7.1f} model tokens/s"
    )
    return episodes / wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--no-peer", action="store_true", help="skip the TRL comparison")
    args = parser.parse_args()
    from helpers import train_tool_caller
    from trl_peer import qwen2_5_template

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = qwen2_5_template()
    model = train_tool_caller(tokenizer, hidden_size=128)
    folder = tempfile.mkdtemp(prefix="toolgym-bench-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for delay in (0.0, 0.05):
        ours = run(args.engine, args.episodes, delay, tokenizer, folder, model)
        if args.engine == "hf" and not args.no_peer:
            peer = run_trl(args.episodes, delay, tokenizer, model)
            print(f"toolgym / TRL throughput, tools {delay * 1000:.0f} ms: {ours / peer:.2f}x")


if __name__ == "__main__":
    main()
