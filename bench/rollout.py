"""Rollout throughput: toolgym's agent loop against the batch-synchronous scheduler it
replaced, TRL's generation path, and the engine's own ceiling.

Workloads (`--workload`):

- `heterogeneous`: turn lengths drawn from a wide distribution (10 to 500 tokens, log-uniform)
  and tool latencies from 0 to 500 ms, 4 turns per episode, a random tiny model (a fixed
  tool-call parser: every turn calls `wait`). Prints model tokens/s for (a) toolgym per
  request (the continuous scheduler), (b) the batch-synchronous scheduler (`scheduler="batch"`),
  (d) the engine alone replaying (a)'s requests at the same concurrency, and the ratios a/b
  and a/d (the last line reads `a/d R`).
- `equal`: every turn 64 tokens, every tool 0 ms; the same figures.
- `wordle` (the original figures, below).

For `wordle`:

Plays Wordle episodes with a model that calls tools every turn (a tiny model trained for a few
steps on a scripted game, so the figures exercise multi-turn tool use), with tools that answer
at once and tools that sleep 50 ms, and prints:

- episodes/s and model tokens/s (median of 5 batches after a warm-up batch);
- framework overhead: the share of wall time in which neither the engine is generating nor any
  tool is running (union of intervals, as episodes overlap). Target: under 3%.

and the same figures for TRL's GRPOTrainer generation path with `environment_factory`
(bench/trl_peer.py; trl is installed into `.bench/site` on first use; with `--engine vllm`,
TRL's colocated vLLM), on the same model, tokenizer, chat template (the Qwen2.5 template trl
ships, which TRL requires), episodes and limits, measured in the same run, and toolgym's
throughput as a multiple of TRL's (`a/c`).

    python bench/rollout.py [--episodes 32] [--engine hf|vllm] [--no-peer]
    python bench/rollout.py --engine vllm-server --workload heterogeneous   # 1 vs 2 servers
    python bench/rollout.py --workload long-tail   # partial rollouts vs the drain (vLLM)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from run_folder import run_folder

import toolgym
from toolgym.agents import Agent, AgentLimits, GenerationRequest, HFEngine, SamplingParams
from toolgym.agents.parsers import ParsedMessage
from toolgym.builtin_envs.wordle import Wordle
from toolgym.envs.calls import ToolCall
from toolgym.testing import tiny_model, tiny_tokenizer

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

    def __getattr__(self, name: str):
        if name == "submit" and hasattr(self.engine, "submit"):
            return self._submit  # per-request engines keep toolgym's default scheduler
        raise AttributeError(name)

    def _submit(self, request):
        start = time.perf_counter()
        future = self.engine.submit(request)
        future.add_done_callback(lambda _: self.busy.add(start, time.perf_counter()))
        return future

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

    # the schema the tool caller was trained on is Wordle's own (its prompt must match)
    TimedWordle.guess.__doc__ = Wordle.guess.__doc__
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
    if not calls:  # the tool caller replays its game only on the prompt it was trained on
        raise SystemExit("the tool caller made no tool call: the figures would measure nothing")
    reward = sum(t.reward for t in trajectories) / episodes
    print(
        f"toolgym {engine_name:4} tools {delay * 1000:3.0f} ms | {episodes} episodes, "
        f"{calls:.0f} tool calls, reward {reward:.2f}, {wall:6.2f} s | "
        f"{episodes / wall:6.2f} episodes/s | "
        f"{tokens / wall:7.1f} model tokens/s | framework overhead {overhead:5.1%}"
    )
    base.close()
    return episodes / wall


def run_trl(engine_name: str, episodes: int, delay: float, tokenizer, folder: str, model) -> float:
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
        engine=engine_name,
        model_folder=folder,
    )
    wall = figures["wall"]
    print(
        f"TRL     {engine_name:4} tools {delay * 1000:3.0f} ms | {episodes} episodes, "
        f"{figures['tool_calls']:.0f} tool calls, reward {figures['reward']:.2f}, "
        f"{wall:6.2f} s | {episodes / wall:6.2f} episodes/s | "
        f"{figures['model_tokens'] / wall:7.1f} model tokens/s"
    )
    return episodes / wall


# -- the synthetic workloads ---------------------------------------------------------------------
SYNTHETIC_TURNS = 4


class WaitingGame(toolgym.Environment):
    """One tool, `wait`, that sleeps a latency drawn per episode and turn."""

    max_turns = SYNTHETIC_TURNS

    def __init__(self, latencies: tuple[float, float] = (0.0, 0.5)) -> None:
        self.low, self.high = latencies

    def reset(self, index: int = 0) -> str | None:
        self.draw = random.Random(index)
        return f"Episode {index}: call wait."

    def wait(self) -> str:
        """Wait for the world."""
        time.sleep(self.draw.uniform(self.low, self.high))
        return "waited"


def always_wait(text: str) -> ParsedMessage:
    """A parser for a random model: every turn is a call of `wait`."""
    return ParsedMessage("", [ToolCall("wait", {})])


class VaryingLengths:
    """Wraps an engine: each request's length is drawn from its prompt (so both schedulers
    see the same lengths), and the turn ends there, as if the model had written its end of
    turn: the engine generates that many tokens and the last one becomes the stop token.
    Every request is recorded for the replay (d)."""

    def __init__(self, engine, lengths: tuple[int, int]) -> None:
        self.engine, self.lengths = engine, lengths
        self.context_length = engine.context_length
        self.requests: list[GenerationRequest] = []
        self.in_flight, self.changes = 0, []  # (time, requests in flight) at every change
        self._lock = threading.Lock()

    def _count(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta
            self.changes.append((time.perf_counter(), self.in_flight))

    def mean_in_flight(self) -> float:
        """Time-weighted mean of the requests in flight over the recorded changes."""
        pairs = list(zip(self.changes, self.changes[1:], strict=False))
        span = self.changes[-1][0] - self.changes[0][0]
        return sum((b[0] - a[0]) * a[1] for a, b in pairs) / span

    def _varied(self, request: GenerationRequest) -> GenerationRequest:
        low, high = self.lengths
        draw = random.Random(hash(tuple(request.prompt_ids)))
        tokens = round(math.exp(draw.uniform(math.log(low), math.log(high))))
        sampling = dataclasses.replace(request.sampling, max_tokens=tokens)
        varied = dataclasses.replace(request, sampling=sampling)  # the session goes along
        self.requests.append(varied)
        return varied

    @staticmethod
    def _ended(request: GenerationRequest, completion):
        stop = request.sampling.stop_token_ids[:1]
        if completion.finish_reason == "length" and stop:
            ids = [*completion.token_ids[:-1], stop[0]]
            return dataclasses.replace(completion, token_ids=ids, finish_reason="stop")
        return completion

    def generate(self, requests):
        varied = [self._varied(r) for r in requests]
        self._count(len(varied))
        completions = self.engine.generate(varied)
        self._count(-len(varied))
        return [self._ended(r, c) for r, c in zip(varied, completions, strict=True)]

    def submit(self, request):
        varied = self._varied(request)
        ended: concurrent.futures.Future = concurrent.futures.Future()

        def finish(future) -> None:
            self._count(-1)
            try:
                ended.set_result(self._ended(varied, future.result()))
            except Exception as error:
                ended.set_exception(error)

        self._count(1)
        self.engine.submit(varied).add_done_callback(finish)
        return ended

    def update_weights(self, weights) -> None:
        self.engine.update_weights(weights)

    @property
    def weights_version(self) -> int | None:
        return getattr(self.engine, "weights_version", None)

    def close(self) -> None:
        self.engine.close()


WORKLOADS = {"heterogeneous": ((10, 500), (0.0, 0.5)), "equal": ((64, 64), (0.0, 0.0))}


def synthetic_model():
    """The synthetic workloads' random tiny model, its tokenizer and the folder it is in."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=3, hidden_size=128)
    with torch.no_grad():  # special tokens score 0: greedy never ends a turn before its length
        model.get_output_embeddings().weight[tokenizer.all_special_ids] = 0.0
    folder = run_folder("toolgym-bench-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer, model, folder


def synthetic(engine_name: str, workload: str, episodes: int) -> dict[str, float]:
    """Model tokens/s of (a) per request, (b) batch-synchronous, (d) the engine alone."""
    lengths, latencies = WORKLOADS[workload]
    tokenizer, model, folder = synthetic_model()
    if engine_name == "vllm":
        from toolgym.agents import VLLMEngine

        base = VLLMEngine(folder, context_length=4096, dtype="float32")
    else:
        base = HFEngine(model, tokenizer)
    engine = VaryingLengths(base, lengths)
    rows = [{"prompt": "Play.", "index": i} for i in range(episodes)]
    figures = {}
    for label, scheduler in (("a", "continuous"), ("b", "batch")):
        if scheduler == "continuous" and not hasattr(base, "submit"):
            continue
        agent = Agent(
            engine,
            tokenizer,
            parser=always_wait,
            sampling=SamplingParams(temperature=0),
            limits=AgentLimits(
                max_turns=SYNTHETIC_TURNS, max_new_tokens=512, max_episode_tokens=8192
            ),
            scheduler=scheduler,
        )
        agent.run([WaitingGame(latencies) for _ in rows], rows)  # warm-up
        engine.requests.clear()
        engine.changes.clear()
        started = time.perf_counter()
        trajectories = agent.run([WaitingGame(latencies) for _ in rows], rows)
        wall = time.perf_counter() - started
        tokens = sum(t.model_tokens for t in trajectories)
        figures[label] = tokens / wall
        if label == "a":
            replay, mean = list(engine.requests), engine.mean_in_flight()
        print(
            f"({label}) toolgym {scheduler:10} {engine_name:4} {workload}: {episodes} episodes, "
            f"{tokens} model tokens in {wall:6.2f} s = {figures[label]:7.1f} tokens/s, "
            f"{engine.mean_in_flight():.1f} requests in flight on average"
        )
    if "a" in figures:
        concurrency = max(1, round(mean))
        figures["d_mean"] = replay_alone(base, replay, concurrency)
        print(f"(d) engine alone, {concurrency} in flight (a's mean): {figures['d_mean']:7.1f}")
        figures["d"] = replay_alone(base, replay, episodes)
        print(f"(d) engine alone, {episodes} in flight (one per episode): {figures['d']:7.1f}")
    base.close()
    return figures


def server_arms(workload: str, episodes: int, repeats: int = 3) -> dict[str, float]:
    """Model tokens/s of toolgym per request on two vLLM servers started here: one server,
    two servers with sticky sessions, two servers with every request to the least-loaded one
    (round-robin placement). The arms take turns, `repeats` rounds after a warm-up each (the
    median is kept: other work on the machine moves single runs); every measured run starts
    from empty prefix caches, and its hits are counted from the servers' `usage` reports."""
    from vllm_servers import Servers

    from toolgym.agents import VLLMServerEngine

    lengths, latencies = WORKLOADS[workload]
    tokenizer, _, folder = synthetic_model()
    servers = Servers(Path(folder), Path(tempfile.mkdtemp(prefix="toolgym-servers-")), 4096)
    runs: dict[str, list[tuple[float, int, int]]] = {}
    engines: dict[str, VLLMServerEngine] = {}
    try:
        urls = [servers.start(), servers.start()]
        for url in urls:
            servers.wait(url)
        arms = {"one server": (urls[:1], True), "two servers": (urls, True)}
        arms["two, round-robin"] = (urls, False)
        for label, (used, sticky) in arms.items():
            engines[label] = VLLMServerEngine(used, sticky=sticky)
        for round_ in range(repeats + 1):
            for label, engine in engines.items():
                run = server_run(engine, tokenizer, lengths, latencies, episodes)
                if round_:  # the first round warms each arm up
                    runs.setdefault(label, []).append(run)
    finally:
        for engine in engines.values():
            engine.close()
        servers.close()
    figures = {}
    for label, measured in runs.items():
        tokens_per_s, prompt, cached = sorted(measured)[len(measured) // 2]
        figures[label] = tokens_per_s
        print(
            f"{label:16} {workload}: {episodes} episodes, median of {repeats}: "
            f"{tokens_per_s:7.1f} model tokens/s (runs: "
            f"{', '.join(f'{run[0]:.0f}' for run in measured)}) | prefix cache held "
            f"{cached}/{prompt} prompt tokens ({cached / prompt:.0%})"
        )
    return figures


def server_run(engine, tokenizer, lengths, latencies, episodes: int) -> tuple[float, int, int]:
    """One run of the synthetic workload on a server engine: model tokens/s, prompt tokens,
    and prompt tokens the servers' prefix caches held (emptied first)."""
    from toolgym.agents.engines.pool import call_json

    agent = Agent(
        VaryingLengths(engine, lengths),
        tokenizer,
        parser=always_wait,
        sampling=SamplingParams(temperature=0),
        limits=AgentLimits(max_turns=SYNTHETIC_TURNS, max_new_tokens=512, max_episode_tokens=8192),
    )
    rows = [{"prompt": "Play.", "index": i} for i in range(episodes)]
    for server in engine.pool.servers:
        call_json(server.url, "POST", "/reset_prefix_cache")
    before = engine.stats()
    started = time.perf_counter()
    trajectories = agent.run([WaitingGame(latencies) for _ in rows], rows)
    wall = time.perf_counter() - started
    after = engine.stats()
    prompt, cached = (
        sum((after[url][key] or 0) - (before[url][key] or 0) for url in after)
        for key in ("prompt_tokens", "cached_tokens")
    )
    return sum(t.model_tokens for t in trajectories) / wall, prompt, cached


def replay_alone(engine, requests: list[GenerationRequest], concurrency: int) -> float:
    """The engine's tokens/s on `requests` with `concurrency` in flight and nothing else."""
    pending, tokens = list(requests), 0
    started = time.perf_counter()
    in_flight = {engine.submit(pending.pop(0)) for _ in range(min(concurrency, len(pending)))}
    while in_flight:
        done, in_flight = concurrent.futures.wait(
            in_flight, return_when=concurrent.futures.FIRST_COMPLETED
        )
        for future in done:
            tokens += len(future.result().token_ids)
            if pending:
                in_flight.add(engine.submit(pending.pop(0)))
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument(
        "--engine",
        choices=["hf", "vllm", "vllm-server"],
        default="hf",
        help="vllm-server: one vs two vLLM servers started here (synthetic workloads)",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the TRL comparison")
    parser.add_argument(
        "--workload",
        choices=["heterogeneous", "equal", "wordle", "long-tail"],
        default="wordle",
        help="long-tail: partial rollouts against the drain in GRPO training (bench/long_tail.py)",
    )
    args = parser.parse_args()
    if args.workload == "long-tail":
        from long_tail import long_tail

        arms = long_tail()
        for name in ("partial", "on-policy"):
            speed = arms[name]["tokens_per_second"] / arms["drain"]["tokens_per_second"]
            step = arms[name]["step_seconds"] / arms["drain"]["step_seconds"]
            print(f"{name}/drain tokens/s {speed:.2f}, step time {step:.2f}")
        return
    if args.engine == "vllm-server":
        figures = server_arms(args.workload if args.workload != "wordle" else "heterogeneous",
                              args.episodes)  # fmt: skip
        print(f"two/one {figures['two servers'] / figures['one server']:.2f}")
        print(f"sticky/round-robin {figures['two servers'] / figures['two, round-robin']:.2f}")
        return
    if args.workload != "wordle":
        figures = synthetic(args.engine, args.workload, args.episodes)
        if "a" not in figures:
            print(f"{args.engine}: no per-request engine (submit); (b) is its only scheduler")
            return
        print(f"a/b {figures['a'] / figures['b']:.2f}")
        if not args.no_peer:
            print("a/c: TRL's generation path is measured by --workload wordle")
        print(f"a/d at a's mean concurrency {figures['a'] / figures['d_mean']:.2f}")
        print(f"a/d {figures['a'] / figures['d']:.2f}")
        return
    from helpers import train_tool_caller
    from trl_peer import qwen2_5_template

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = qwen2_5_template()
    model = train_tool_caller(tokenizer, hidden_size=128)
    folder = run_folder("toolgym-bench-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    ratios = {}
    for delay in (0.0, 0.05):
        ours = run(args.engine, args.episodes, delay, tokenizer, folder, model)
        if not args.no_peer:
            peer = run_trl(args.engine, args.episodes, delay, tokenizer, folder, model)
            ratios[delay] = ours / peer
    for delay, ratio in ratios.items():
        print(f"a/c (toolgym / TRL, {args.engine}, tools {delay * 1000:.0f} ms) {ratio:.2f}")


if __name__ == "__main__":
    main()
