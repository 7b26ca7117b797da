"""`HFEngine`: transformers `generate` with left padding and per-token logprobs (CPU default)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from toolgym.agents.engines.base import (
    Completion,
    EngineCapabilities,
    GenerationRequest,
    SamplingParams,
    first_stop_string_end,
)

_SAMPLING_KEYS = ("temperature", "top_p")


class HFEngine:
    """Generates with a transformers causal LM. Requests with equal sampling settings share a
    batch (left-padded); logprobs are those of the distribution actually sampled from (after
    temperature and top-p).

    Args:
        model: A transformers causal LM (the policy itself when training on one device).
        tokenizer: Its tokenizer (for the pad id).
        context_length: Longest prompt + completion; defaults to the model's positions.
        vision: For requests with images (`toolgym.agents.images`): their pixel inputs.
    """

    capabilities = EngineCapabilities(own_weights=False, update_with="model")
    """Samples from the policy model itself: batches only, no rollouts during an update."""

    def __init__(
        self, model: Any, tokenizer: Any, context_length: int | None = None, vision: Any = None
    ) -> None:
        self.model, self.tokenizer, self.vision = model, tokenizer, vision
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.context_length = context_length or int(
            getattr(model.config, "max_position_embeddings", 2048)
        )
        self._lock = threading.Lock()  # one generate() at a time on one model

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in order (transformers `generate`, batched)."""
        results: list[Completion | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            key = (
                *(getattr(request.sampling, k) for k in _SAMPLING_KEYS),
                tuple(request.sampling.stop_token_ids),
                tuple(request.sampling.stop_strings),
                # a request with images goes alone, and so does a seeded sampled one (its
                # tokens must not depend on what else shares its batch)
                index if request.images or _seed(request.sampling) is not None else -1,
            )
            groups.setdefault(key, []).append(index)
        with self._lock:
            for indices in groups.values():
                batch = [requests[i] for i in indices]
                for index, completion in zip(indices, self._generate_batch(batch), strict=True):
                    results[index] = completion
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Completion]:
        sampling = requests[0].sampling
        device = next(self.model.parameters()).device
        longest = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), longest), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(requests), longest), dtype=torch.long)
        for row, request in enumerate(requests):
            input_ids[row, longest - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            attention[row, longest - len(request.prompt_ids) :] = 1
        greedy = sampling.temperature == 0
        # A complete config, so that the model's own defaults (top_k, repetition penalty, ...)
        # cannot change the distribution whose logprobs we report.
        config = GenerationConfig(
            max_new_tokens=max(r.sampling.max_tokens for r in requests),
            do_sample=not greedy,
            temperature=1.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=None if greedy else 0,  # 0 turns top-k off (only sampling reads it)
            eos_token_id=sampling.stop_token_ids or None,
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
            # a model that sees images never writes its image placeholder (it would stand for
            # an image that is not there)
            suppress_tokens=[self.vision.image_token_id] if self.vision is not None else None,
        )
        stops = sampling.stop_strings
        images = requests[0].images
        if images and self.vision is None:
            raise ValueError("this engine was given no image processor (HFEngine(vision=...))")
        pixels = self.vision.model_inputs(input_ids.to(device), images) if images else {}
        with _seeded(_seed(sampling), device):
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                **pixels,
                generation_config=config,
                stopping_criteria=StoppingCriteriaList([_StopStrings(stops, longest, self._decode)])
                if stops
                else None,
            )
        new_tokens = output.sequences[:, longest:].cpu()
        logprobs = torch.stack(output.scores, dim=1).float().log_softmax(-1).cpu()
        chosen = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return [
            _trim(new_tokens[row].tolist(), chosen[row].tolist(), request, self._decode)
            for row, request in enumerate(requests)
        ]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def update_weights(self, model_or_state_dict: Any) -> None:
        """Load a state dict (or another model's weights) into the generating model.

        Passing the generating model itself (the policy trained in place) is a no-op.
        """
        if model_or_state_dict is self.model:
            return
        state = (
            model_or_state_dict.state_dict()
            if hasattr(model_or_state_dict, "state_dict")
            else model_or_state_dict
        )
        self.model.load_state_dict(state)

    def close(self) -> None:
        """Nothing to release: the model belongs to the caller."""


def _seed(sampling: SamplingParams) -> int | None:
    """The seed a request samples with (none when greedy: there is nothing to draw)."""
    return None if sampling.temperature == 0 else sampling.seed


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Sample from `seed`'s own stream (torch's global one is put back after); nothing
    without a seed. transformers samples from the global generator of the model's device."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


class _StopStrings(StoppingCriteria):
    """Ends a row once its decoded new tokens contain a stop string (anywhere: a token may
    carry text past the marker, as in vLLM)."""

    def __init__(self, stops: list[str], prompt_length: int, decode: Any) -> None:
        self.stops, self.prompt_length, self.decode = stops, prompt_length, decode

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        rows = input_ids[:, self.prompt_length :].tolist()
        done = [any(stop in self.decode(row) for stop in self.stops) for row in rows]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _trim(
    ids: list[int], logprobs: list[float], request: GenerationRequest, decode: Any
) -> Completion:
    """Cut a row at its first stop token, its first stop string or its own max_tokens (the
    batch ran to the longest)."""
    stops = set(request.sampling.stop_token_ids)
    limit = request.sampling.max_tokens
    ids = ids[:limit]
    end = next((i + 1 for i, token in enumerate(ids) if token in stops), None)
    by_string = first_stop_string_end(ids[:end], request.sampling.stop_strings, decode)
    end = by_string or end
    if end is not None:
        return Completion(ids[:end], logprobs[:end], "stop")
    return Completion(ids, logprobs[:limit], "length")
