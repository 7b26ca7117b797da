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
allocator's overhead, fitted to measured updates); the other parts are exact sizes. The peak
is what is held throughout plus the larger of the rollouts' own parts and the update's (both
when rollouts run during the update, `max_staleness`). When what is still to come (the policy
is loaded by then) passes the memory available to the process (`MemAvailable`, or its
cgroup's limit), the run stops before it starts, naming the parts and the settings that shrink
the largest.

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
    "engine KV cache": "kv_cache_tokens",
    "engine KV cache (transformers)": "engine='vllm' (the transformers engine keeps a cache per "
    "episode in flight), prompts_per_step x num_generations, or limits.max_episode_tokens",
    "engine weights": "engine='hf' (it samples from the policy itself)",
    "policy": "a smaller model",
    "reference model": "beta=0 (no KL reference)",
}


RESIDENT = ("policy", "reference model")
"""Parts already loaded when the check runs: the memory available then excludes them."""
ROLLOUT_ONLY = ("engine KV cache (transformers)",)
"""Parts held only while episodes are played (the update runs after them, unless pipelined)."""
UPDATE_ONLY = ("update activations", "output-head logits")
"""Parts held only during the update."""


@dataclass
class MemoryEstimate:
    """What a run will hold, by part, and what the machine has available."""

    parts: dict[str, int] = field(default_factory=dict)
    available: int | None = None
    pipelined: bool = False
    """Rollouts run during the update (`max_staleness`): their parts and the update's add up."""

    @property
    def total(self) -> int:
        """The peak: the parts held throughout, plus the larger of the rollouts' and the
        update's own parts (both, when they overlap)."""
        rollout = sum(v for k, v in self.parts.items() if k in ROLLOUT_ONLY)
        update = sum(v for k, v in self.parts.items() if k in UPDATE_ONLY)
        always = sum(v for k, v in self.parts.items() if k not in ROLLOUT_ONLY + UPDATE_ONLY)
        return always + (rollout + update if self.pipelined else max(rollout, update))

    @property
    def to_come(self) -> int:
        """The peak less what is already loaded (what must still fit in the available memory)."""
        return self.total - sum(v for k, v in self.parts.items() if k in RESIDENT)

    def describe(self) -> str:
        """The parts, largest first, in GB."""
        parts = sorted(self.parts.items(), key=lambda item: -item[1])
        return ", ".join(f"{name} {size / 1e9:.2f} GB" for name, size in parts)

    def fits(self) -> bool:
        """Whether what is still to come fits in the available memory (True when unknown)."""
        return self.available is None or self.to_come <= self.available


def estimate(args: GRPOConfig, model: Any, eval_rows: int = 0) -> MemoryEstimate:
    """The CPU memory a run of `model` with `args` will hold at its peak (see the module); the
    model as the trainer holds it (LoRA adapters in place), `eval_rows` the evaluation's."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", config)
    parameters = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in parameters)
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    parts = {
        "policy": weights,
        "gradients": trainable * 4,
        "optimizer state": trainable * 8,  # AdamW's two float32 moments
    }
    if args.beta > 0:
        parts["reference model"] = weights
    found = MemoryEstimate(parts, available_memory(), pipelined=args.max_staleness > 0)
    if config is None:
        return found
    layers, hidden = config.num_hidden_layers, config.hidden_size
    intermediate = getattr(config, "intermediate_size", 4 * hidden)
    episodes = min(args.micro_batch_size, args.prompts_per_step * args.num_generations)
    tokens = episodes * (args.limits.max_episode_tokens + PROMPT_ROOM)
    layer = (8 * hidden + 3 * intermediate) * 4  # one layer's float32 intermediates per token
    # checkpointing keeps each layer's input and its gradient, and recomputes one layer
    kept = 2 * (layers * hidden * 4 + layer) if args.gradient_checkpointing else layers * layer
    fixed = args.mmap_threshold != 0
    parts["update activations"] = int(tokens * kept * FRAGMENTATION[fixed])
    chunk = min(args.logprob_chunk_size, tokens)
    parts["output-head logits"] = chunk * config.vocab_size * 4 * 3  # logits, softmax, grad
    parts.update(_engine_parts(args, config, weights, eval_rows))
    return found


def _engine_parts(args: GRPOConfig, config: Any, weights: int, eval_rows: int) -> dict[str, int]:
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * 4
    in_flight = max(args.prompts_per_step * args.num_generations, eval_rows)
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
        return {"engine KV cache (transformers)": in_flight * episode * per_token}
    return {}  # a vLLM server: its memory is its own process's


def available_memory() -> int | None:
    """What this process may still take: `MemAvailable` from /proc/meminfo, or less where
    its cgroup's `memory.max` leaves less (None where neither is known)."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    room = _cgroup_room()
    if room is not None:
        available = room if available is None else min(available, room)
    return available


def _cgroup_room() -> int | None:
    """`memory.max` less `memory.current` of this process's cgroup (v2), where it is set."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as file:
            path = next(line.split("::", 1)[1].strip() for line in file if line.startswith("0::"))
        folder = f"/sys/fs/cgroup{path}"
        with open(f"{folder}/memory.max", encoding="ascii") as file:
            limit = file.read().strip()
        with open(f"{folder}/memory.current", encoding="ascii") as file:
            current = int(file.read())
    except (OSError, StopIteration, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - current)


def check_fit(
    args: GRPOConfig, model: Any, device_type: str, eval_rows: int = 0
) -> MemoryEstimate | None:
    """Refuse a CPU run whose estimate passes the available memory, naming the largest parts
    and the settings that shrink them (`GRPOConfig.memory_check=False` skips it); the estimate
    (None on other devices, without a model, or when skipped)."""
    if device_type != "cpu" or not args.memory_check or model is None:
        return None
    found = estimate(args, model, eval_rows)
    if found.fits():
        return found
    assert found.available is not None
    largest = sorted(found.parts.items(), key=lambda item: -item[1])[:2]
    remedies = "; ".join(f"{name}: {REMEDIES.get(name, 'see docs')}" for name, _ in largest)
    raise MemoryError(
        f"this run would need about {found.to_come / 1e9:.1f} GB more memory at its peak (with "
        f"episodes at their full limits.max_episode_tokens), and the machine has "
        f"{found.available / 1e9:.1f} GB available ({found.describe()}). It would be killed by "
        f"the kernel; shrink the largest parts ({remedies}), or set memory_check=False to "
        "start anyway (docs/training.md#memory)"
    )
