"""The engine interface: token-id prompts in, sampled token ids with logprobs out."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    """How to sample one completion.

    Attributes:
        max_tokens: Most tokens to generate.
        temperature: Softmax temperature; 0 means greedy.
        top_p: Nucleus sampling mass (1.0 keeps every token).
        stop_token_ids: Generation stops after any of these (it is included in the output).
        stop_strings: Generation stops after the token that completes any of these in the
            decoded completion (the inline protocol's markers); every sampled token is kept,
            so the marker, and any text its last token carries past it, are in the output.
        seed: Seeds this completion's sampling: the same seed, prompt and weights sample the
            same tokens, and a small change of weights mostly the same ones (common random
            numbers, for paired evaluations). None: the engine's own random stream. Given
            to an agent's episodes, it is each episode's base seed (`completion_seed`).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    seed: int | None = None


def completion_seed(base: int, *keys: object) -> int:
    """A seed for one completion, from an episode's base seed and what tells its completions
    apart (the episode's place in its run, the turn): stable across processes and runs, and
    below 2**63 (every engine takes it)."""
    text = repr((base, *keys)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


@dataclass
class GenerationRequest:
    """One completion to generate: prompt token ids and sampling settings."""

    prompt_ids: list[int]
    sampling: SamplingParams
    session: str | None = None
    """The episode (or endpoint session) it continues: an engine over several servers keeps
    a session's requests on one server, whose prefix cache holds its earlier turns."""
    images: list[str] = field(default_factory=list)
    """The images `prompt_ids` show (data URLs), for engines whose model sees them."""


@dataclass
class Completion:
    """Sampled ids, the logprob of each under the sampling distribution, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    versions: list[int] = field(default_factory=list)
    """The engine's `weights_version` that sampled each token (a completion interrupted by a
    weight update holds two); empty where the engine counts no versions."""


def first_stop_string_end(
    ids: list[int], stop_strings: list[str], decode: Callable[[list[int]], str]
) -> int | None:
    """How many of `ids` make the shortest prefix whose decoded text contains one of
    `stop_strings` (None: none does). Engines cut a completion there, keeping that token."""
    if not stop_strings:
        return None
    text = decode(ids)
    if not any(stop in text for stop in stop_strings):
        return None
    low, high = 1, len(ids)  # containment only grows with the prefix: bisect for the first
    while low < high:
        middle = (low + high) // 2
        if any(stop in decode(ids[:middle]) for stop in stop_strings):
            high = middle
        else:
            low = middle + 1
    return low


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do, declared by the engine (the scheduler and the trainer read it
    instead of checking engine classes)."""

    per_request: bool = False
    """`submit(request) -> Future[Completion]`: each request runs as it comes (continuous
    batching); otherwise requests go in batches to `generate`."""
    own_weights: bool = True
    """Samples from a copy of the weights of its own, so rollouts may run while the learner
    updates the policy (`GRPOConfig.max_staleness`); False for an engine over the policy
    model itself."""
    update_with: Literal["state_dict", "model"] = "state_dict"
    """What `update_weights` takes: the policy's state dict (LoRA merged), or the model."""


def capabilities(engine: Any) -> EngineCapabilities:
    """`engine.capabilities`, or, for an engine that declares none, what its methods show
    (a `submit` method: per request)."""
    declared = getattr(engine, "capabilities", None)
    if isinstance(declared, EngineCapabilities):
        return declared
    return EngineCapabilities(per_request=callable(getattr(engine, "submit", None)))


@runtime_checkable
class Engine(Protocol):
    """What the rollout scheduler needs from a generation backend (and `capabilities`, an
    `EngineCapabilities`, where it differs from the defaults)."""

    context_length: int

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in order. Called from a worker thread."""
        ...

    def update_weights(self, model_or_state_dict: Any) -> None:
        """Load new policy weights (engines that count them add 1 to `weights_version`)."""
        ...

    def close(self) -> None:
        """Release the engine's memory and threads."""
        ...


class PerRequestEngine(Engine, Protocol):
    """An engine with `capabilities.per_request`: one request at a time, each resumed as soon
    as it is done."""

    def submit(self, request: GenerationRequest) -> Future[Completion]:
        """Start generating `request`; its completion, when done."""
        ...
