"""Will a run fit in this machine's memory? An estimate made before the engine starts.

A run that does not fit used to be killed by the kernel in its first updates (the embedded
SmolLM2-135M at the old defaults grew to 24 GB on a 24 GB machine). `check_fit` adds up what
the run will hold at once on the CPU: the policy, its gradients and AdamW's two moments, a KL
reference, the in-process engine (vLLM's copy of the weights and its KV cache; the
transformers engine's caches of the episodes in flight), and the update's largest
micro-batch: the activations it keeps for the backward pass (one layer input per token and
layer with gradient checkpointing, every intermediate without) and a chunk of output-head
logits. The episodes are taken at their full `limits.max_episode_tokens`, the most the
settings allow. The estimate of the activations is that arithmetic times `FRAGMENTATION` (the
allocator's overhead, fitted to measured updates); the other parts are exact sizes. When the
total passes the memory the machine has available, the run stops before it starts, naming the
parts and the settings that shrink the largest.

Only the CPU is estimated (a CUDA run's device memory is vLLM's and PyTorch's to manage), and
only this process (sandboxed environments and vLLM servers live elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolgym.algorithms.config import GRPOConfig

PROMPT_ROOM = 256
"""Tokens of prompt assumed beside `limits.max_episode_tokens` (as the KV cache's default)."""
FRAGMENTATION = {True: 1.2, False: 2.0}
"""Allocator overhead on the activations, with and without a fixed mmap threshold (fitted to
the update of SmolLM2-135M over 24 episodes of ~650 tokens, micro-batches of 8: 244 KB a token
with checkpointing and a 4 MiB threshold, 2.2 MB a token with neither)."""
ENGINE_RUNTIME = 1 << 30
"""vLLM's own memory in the process besides weights and KV cache (measured about 1 GB)."""

REMEDIES = {
    "update activations": "micro_batch_size, limits.max_episode_tokens, or "
    "gradient_checkpointing=True",
    "output-head logits": "logprob_chunk_size",
    "optimizer state": "lora={...} (adapters train far fewer parameters)",
    "gradients": "lora={...}",
    "engine KV cache": "kv_cache_tokens (vLLM), or engine='vllm' (transformers keeps a cache "
    "per episode in flight)",
    "engine weights": "engine='hf' (it samples from the policy itself)",
    "policy": "a smaller model",
    "reference model": "beta=0 (no KL reference)",
}


@dataclass
class MemoryEstimate:
    """What a run will hold at once, by part, and what the machine has available."""

    parts: dict[str, int] = field(default_factory=dict)
    available: int | None = None

    @property
    def total(self) -> int:
        """The bytes of every part together."""
        return sum(self.parts.values())

    def describe(self) -> str:
        """The parts, largest first, in GB."""
        parts = sorted(self.parts.items(), key=lambda item: -item[1])
        return ", ".join(f"{name} {size / 1e9:.2f} GB" for name, size in parts)

    def fits(self) -> bool:
        """Whether the total is within the available memory (True when it is unknown)."""
        return self.available is None or self.total <= self.available


def estimate(args: GRPOConfig, model: Any) -> MemoryEstimate:
    """The CPU memory a run of `model` with `args` will hold at its peak (see the module)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", config)
    parameters = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in parameters)
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    if args.lora is not None:
        trainable = max(1, trainable // 100)  # adapters: about 1% of the weights
    parts = {
        "policy": weights,
        "gradients": trainable * 4,
        "optimizer state": trainable * 8,  # AdamW's two float32 moments
    }
    if args.beta > 0:
        parts["reference model"] = weights
    if config is None:
        return MemoryEstimate(parts, available_memory())
    layers, hidden = config.num_hidden_layers, config.hidden_size
    intermediate = getattr(config, "intermediate_size", 4 * hidden)
    tokens = args.micro_batch_size * (args.limits.max_episode_tokens + PROMPT_ROOM)
    layer = (8 * hidden + 3 * intermediate) * 4  # one layer's float32 intermediates per token
    # checkpointing keeps each layer's input and its gradient, and recomputes one layer
    kept = 2 * (layers * hidden * 4 + layer) if args.gradient_checkpointing else layers * layer
    fixed = args.mmap_threshold != 0
    parts["update activations"] = int(tokens * kept * FRAGMENTATION[fixed])
    chunk = min(args.logprob_chunk_size, tokens)
    parts["output-head logits"] = chunk * config.vocab_size * 4 * 3  # logits, softmax, grad
    parts.update(_engine_parts(args, config, weights))
    return MemoryEstimate(parts, available_memory())


def _engine_parts(args: GRPOConfig, config: Any, weights: int) -> dict[str, int]:
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * 4
    in_flight = args.prompts_per_step * args.num_generations
    if args.engine == "vllm":
        from toolgym.agents.engines.vllm import default_kv_cache_tokens

        episode = args.limits.max_episode_tokens
        cache = args.kv_cache_tokens or default_kv_cache_tokens(in_flight, episode, per_token)
        return {
            "engine weights": weights + ENGINE_RUNTIME,
            "engine KV cache": cache * per_token,
        }
    if args.engine == "hf":
        episode = args.limits.max_episode_tokens + PROMPT_ROOM
        return {"engine KV cache": in_flight * episode * per_token}
    return {}  # a vLLM server: its memory is its own process's


def available_memory() -> int | None:
    """`MemAvailable` from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fit(args: GRPOConfig, model: Any, device_type: str) -> MemoryEstimate | None:
    """Refuse a CPU run whose estimate passes the available memory, naming the largest parts
    and the settings that shrink them (`GRPOConfig.memory_check=False` skips it); the estimate
    (None on other devices or when skipped)."""
    if device_type != "cpu" or not args.memory_check:
        return None
    found = estimate(args, model)
    if found.fits():
        return found
    assert found.available is not None
    largest = sorted(found.parts.items(), key=lambda item: -item[1])[:2]
    remedies = "; ".join(f"{name}: {REMEDIES.get(name, 'see docs')}" for name, _ in largest)
    raise MemoryError(
        f"this run would need about {found.total / 1e9:.1f} GB of memory at once, and the "
        f"machine has {found.available / 1e9:.1f} GB available ({found.describe()}). It would "
        f"be killed by the kernel; shrink the largest parts ({remedies}), or set "
        "memory_check=False to start anyway (docs/training.md#memory)"
    )
