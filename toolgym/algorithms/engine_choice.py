"""The engine a trainer samples with, built from `GRPOConfig.engine`.

`"hf"` samples from the policy itself (transformers); `"vllm"` loads a copy of its weights
written once to `folder` (LoRA adapters merged), `"vllm-server"` talks to servers that hold
their own; both are given the policy's weights after each step.
What an engine can do is read from it (`toolgym.agents.engines.base.capabilities`), never
from which class it is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import torch

from toolgym.agents.engines.base import capabilities
from toolgym.algorithms.config import GRPOConfig
from toolgym.algorithms.memory_fit import check_fit
from toolgym.algorithms.weights import policy_state_dict, save_policy
from toolgym.runtime.heap import return_freed_memory

ENGINES = ("hf", "vllm", "vllm-server")
"""The names `GRPOConfig.engine` takes."""


def make_engine(
    args: GRPOConfig,
    policy: Any,
    tokenizer: Any,
    folder: Path,
    eval_rows: list[Any],
    vision: Any = None,
) -> Any:
    """The engine `args.engine` names, sampling with `policy`'s weights; a vLLM engine's KV
    cache on the CPU holds a step's episodes (or an evaluation's rows) at their longest; the
    transformers engine takes images with `vision` (`toolgym.agents.images`). First, a CPU
    run whose memory estimate passes what the machine has is refused (`memory_fit`)."""
    if vision is not None and args.engine != "hf":
        raise ValueError(
            f"engine={args.engine!r} cannot show the images of tool results: a processor "
            "(tokenizer=processor) samples with engine='hf' only for now; to train this model "
            "on text alone with vLLM, pass the processor's tokenizer (processor.tokenizer)"
        )
    if policy is not None:  # (none under FSDP with a server: it holds no full copy)
        device = next(iter(policy.parameters())).device.type
        check_fit(args, policy, device, len(eval_rows))  # one that cannot fit stops here
    if args.engine == "hf":
        from toolgym.agents.engines.hf import HFEngine

        return HFEngine(policy, tokenizer, vision=vision)
    if args.engine not in ENGINES:
        raise ValueError(f"unknown engine {args.engine!r}; one of {', '.join(ENGINES)}")
    tokenizer.save_pretrained(folder)  # (the run viewer reads it there)
    if args.engine == "vllm":
        save_policy(policy, folder)  # LoRA adapters merged: vLLM loads the base model
        from toolgym.agents.engines.vllm import (
            VLLMEngine,
            default_kv_cache_tokens,
            kv_bytes_per_token,
        )

        # The policy's own dtype: vLLM's "auto" would serve a float32 model in 16 bits, so
        # sampling logprobs would drift from the trainer's.
        dtype = str(policy.dtype).removeprefix("torch.")
        per_step = args.prompts_per_step * args.num_generations
        in_flight = max(per_step * args.steps_in_flight(), len(eval_rows))
        per_token = kv_bytes_per_token(str(folder), dtype)
        episode = args.limits.max_episode_tokens
        tokens = args.kv_cache_tokens or default_kv_cache_tokens(in_flight, episode, per_token)
        kv = {} if torch.cuda.is_available() else {"kv_cache_tokens": tokens}
        quiet = {} if args.verbose else {"use_tqdm_on_load": False}
        overlapping = args.steps_in_flight() > 1
        updates: Literal["finish", "continue"] = "continue" if overlapping else "finish"
        return VLLMEngine(
            str(folder), dtype=dtype, seed=args.seed, in_flight_updates=updates, **kv, **quiet
        )
    from toolgym.agents.engines.server import VLLMServerEngine

    return VLLMServerEngine(
        args.vllm_server_url, weights_dir=str(folder), weight_sync=args.weight_sync
    )


def check_pipelining(args: GRPOConfig, engine: Any) -> None:
    """Refuse `max_staleness` with an engine that shares the policy's weights."""
    if args.max_staleness and not capabilities(engine).own_weights:
        raise ValueError(
            "max_staleness > 0 plays rollouts while the update runs, which needs an engine "
            "with its own copy of the weights: engine='vllm' or 'vllm-server'"
        )


def shares_servers(engine: Any) -> bool:
    """Whether `engine` samples on servers that every trainer process reaches (a server
    engine's pool of URLs), rather than on a copy of the weights of its process's own."""
    return getattr(engine, "pool", None) is not None


def sync_weights(
    engine: Any, policy: Any, accelerator: Any = None, weights: dict[str, Any] | None = None
) -> dict[str, float]:
    """Give `engine` the policy's current weights: the model itself where it samples from it
    (transformers), else `weights` or the policy's state dict with any LoRA adapters merged
    (vLLM).

    Servers shared by several trainer processes (which hold equal weights after an update)
    are synced once, by the main process, while the others wait at a barrier until every
    server holds the new weights, then count the new version (`ServerPool.advance`): each
    process writing the same folder and reloading every server would sync each server once
    per process, and a server could read the file while another process rewrites it.

    Returns the step's figures: `weight_sync_seconds` (this process's wall time, the wait
    included) and `weight_sync_bytes` (what this process handed the engine: 0 where the
    engine samples from the policy itself or another process synced)."""
    started, sent = time.perf_counter(), 0
    shared = accelerator is not None and accelerator.num_processes > 1 and shares_servers(engine)
    try:
        if shared and not accelerator.is_main_process:
            pass  # the main process syncs the servers meanwhile
        elif capabilities(engine).update_with == "model":
            engine.update_weights(policy)
        else:
            state = policy_state_dict(policy) if weights is None else weights
            sent = sum(t.numel() * t.element_size() for t in state.values())
            engine.update_weights(state)
            del state
            return_freed_memory()  # the copies made for the engine
    finally:
        if shared:  # even when a sync failed: the others must not wait for the timeout
            accelerator.wait_for_everyone()
    if shared and not accelerator.is_main_process:
        engine.pool.advance()  # a server back later is let in once it reports these weights
    return {"weight_sync_seconds": time.perf_counter() - started, "weight_sync_bytes": sent}
