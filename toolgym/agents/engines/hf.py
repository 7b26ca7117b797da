"""`HFEngine`: transformers `generate` with left padding and per-token logprobs (CPU default)."""

from __future__ import annotations

import threading
from typing import Any

import torch
from transformers import GenerationConfig

from toolgym.agents.engines.base import Completion, GenerationRequest

_SAMPLING_KEYS = ("temperature", "top_p")


class HFEngine:
    """Generates with a transformers causal LM. Requests with equal sampling settings share a
    batch (left-padded); logprobs are those of the distribution actually sampled from (after
    temperature and top-p).

    Args:
        model: A transformers causal LM (the policy itself when training on one device).
        tokenizer: Its tokenizer (for the pad id).
        context_length: Longest prompt + completion; defaults to the model's positions.
    """

    def __init__(self, model: Any, tokenizer: Any, context_length: int | None = None) -> None:
        self.model = model
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
            key = tuple(getattr(request.sampling, k) for k in _SAMPLING_KEYS) + tuple(
                request.sampling.stop_token_ids
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
        )
        output = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
        )
        new_tokens = output.sequences[:, longest:].cpu()
        logprobs = torch.stack(output.scores, dim=1).float().log_softmax(-1).cpu()
        chosen = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return [
            _trim(new_tokens[row].tolist(), chosen[row].tolist(), request)
            for row, request in enumerate(requests)
        ]

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


def _trim(ids: list[int], logprobs: list[float], request: GenerationRequest) -> Completion:
    """Cut a row at its first stop token or its own max_tokens (the batch ran to the longest)."""
    stops = set(request.sampling.stop_token_ids)
    limit = request.sampling.max_tokens
    for i, token in enumerate(ids[:limit]):
        if token in stops:
            return Completion(ids[: i + 1], logprobs[: i + 1], "stop")
    return Completion(ids[:limit], logprobs[:limit], "length")
