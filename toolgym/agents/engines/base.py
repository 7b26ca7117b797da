"""The engine interface: token-id prompts in, sampled token ids with logprobs out."""

from __future__ import annotations

from collections.abc import Callable
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
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)


@dataclass
class GenerationRequest:
    """One completion to generate: prompt token ids and sampling settings."""

    prompt_ids: list[int]
    sampling: SamplingParams


@dataclass
class Completion:
    """Sampled ids, the logprob of each under the sampling distribution, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


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


@runtime_checkable
class Engine(Protocol):
    """What the rollout scheduler needs from a generation backend."""

    context_length: int

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in order. Called from a worker thread."""
        ...

    def update_weights(self, model_or_state_dict: Any) -> None:
        """Load new policy weights."""
        ...

    def close(self) -> None:
        """Release the engine's memory and threads."""
        ...
