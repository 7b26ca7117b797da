"""A micro-batch's common prompt prefix computed once (`GRPOConfig.share_prefix`).

The rows of an update's micro-batch usually open with the same tokens: every episode of a
group, often of a whole step, starts with the same system prompt, tool schemas and task. The
plain forward pass computes those positions once per row. Here the longest prefix that every
row shares runs once, as a batch of one, keeping each layer's keys and values; then the rows'
own tokens run as a batch that attends to those keys and values (broadcast to every row). The
hidden states are the plain pass's (the same function of the same inputs, in another order of
operations), and the gradient flows back through the shared keys and values into the prefix
pass, so the loss and its gradient are the plain path's up to rounding
(`tests/test_prefix_sharing.py` compares them in float64).

Both passes use cache layers that never grow: the prefix pass keeps the first keys and values
a layer gives it, the rows' pass prepends the prefix's without storing anything, so a layer
that gradient checkpointing replays in the backward pass computes the same thing again.
Models whose cache is not plain full attention (sliding windows, recurrent state) and models
whose shared pass does not reproduce the plain one on a probe run the plain pass, with one
warning.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_SHARED_TOKENS = 8
"""A shorter common prefix is not worth a second forward call."""


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading tokens every row of a right-padded batch shares (0 for one row), short
    of each row's last real token so that every row keeps at least one token of its own."""
    if input_ids.shape[0] < 2:
        return 0
    shortest = int(attention_mask.sum(1).min())
    same = (input_ids[:, :shortest] == input_ids[:1, :shortest]).all(0)
    differs = (~same).nonzero()
    common = int(differs[0]) if len(differs) else shortest
    return min(common, shortest - 1)


class _RecordingLayer(DynamicLayer):
    """The prefix pass's cache layer: keeps the first keys and values it is given (a replay
    by gradient checkpointing gives the same again) and reports no past."""

    recorded: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.recorded is None:
            self.recorded = (key_states, value_states)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0


class _PrefixLayer(DynamicLayer):
    """The rows' pass: the shared prefix's keys and values before each row's own, stored
    nowhere."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.prefix = (keys, values)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = key_states.shape[0]
        keys, values = (
            shared.expand(rows, *shared.shape[1:]).to(own.dtype)
            for shared, own in zip(self.prefix, (key_states, value_states), strict=True)
        )
        return torch.cat([keys, key_states], -2), torch.cat([values, value_states], -2)

    def get_seq_length(self) -> int:
        return self.prefix[0].shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


def _cache(config: Any, layers: Sequence[DynamicLayer]) -> DynamicCache:
    cache = DynamicCache(config=config)
    cache.layers = list(layers)
    return cache


def _full_attention_cache(config: Any) -> bool:
    """Whether the model's own cache is one plain full-attention layer per decoder layer."""
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config the cache cannot read: not shareable
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


@contextmanager
def _cache_kept_under_checkpointing(model: Any) -> Iterator[None]:
    """Let checkpointed decoder layers keep the cache (ours is safe to replay)."""
    layers = [m for m in model.modules() if hasattr(type(m), "_can_checkpoint_with_cache")]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache


def shared_forward(
    model: Any, inner: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int
) -> None:
    """Run `model` on a right-padded batch whose rows share their first `prefix` tokens: the
    prefix once (through `inner`, the unwrapped model, so a DDP wrapper sees one forward per
    backward), then the rows' remaining tokens (what the passes return is left to hooks and
    head captures: the prefix pass's positions are the first of every row)."""
    config = inner.config
    recording = [_RecordingLayer() for _ in DynamicCache(config=config).layers]
    with _cache_kept_under_checkpointing(inner):
        inner(
            input_ids=input_ids[:1, :prefix],
            attention_mask=attention_mask[:1, :prefix],
            past_key_values=_cache(config, recording),
            use_cache=False,  # the given cache is read and written all the same
        )
        if any(layer.recorded is None for layer in recording):
            raise RuntimeError("a layer of the prefix pass never reached its cache")
        shared = [_PrefixLayer(*layer.recorded) for layer in recording]  # type: ignore[misc]
        model(
            input_ids=input_ids[:, prefix:],
            attention_mask=attention_mask,
            past_key_values=_cache(config, shared),
            use_cache=False,
        )


_REPRODUCES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def prefix_sharing_works(inner: Any, run: Any) -> bool:
    """Whether `inner` (an unwrapped causal LM) can share prefixes: its cache is plain full
    attention and `run(input_ids, attention_mask, share)` -> (B, L, width) hidden states gives
    the same with and without sharing on a small probe; the answer is kept per model."""
    if inner not in _REPRODUCES:
        works = _full_attention_cache(inner.config)
        if works:
            generator = torch.Generator().manual_seed(0)
            vocabulary = inner.get_input_embeddings().num_embeddings
            ids = torch.randint(vocabulary, (2, 2 * MIN_SHARED_TOKENS + 4), generator=generator)
            ids[1, : MIN_SHARED_TOKENS + 2] = ids[0, : MIN_SHARED_TOKENS + 2]
            mask = torch.ones_like(ids)
            mask[1, -2:] = 0
            device = inner.get_input_embeddings().weight.device
            ids, mask = ids.to(device), mask.to(device)
            was_training = inner.training
            inner.eval()
            try:
                with torch.no_grad(), torch.autocast(device.type, enabled=False):
                    plain, shared = run(ids, mask, False), run(ids, mask, True)
                real = mask.bool()
                expected, got = plain[real].float(), shared[real].float()
                scale = float(expected.abs().max())
                works = bool(torch.allclose(got, expected, rtol=1e-3, atol=1e-3 * scale))
            except Exception:  # any failure means: do not share
                works = False
            finally:
                inner.train(was_training)
        _REPRODUCES[inner] = works
        if not works:
            warnings.warn(
                f"{type(inner).__name__}: the micro-batch's common prefix cannot be computed "
                "once for this model (its cache is not plain full attention, or the shared "
                "pass does not reproduce the plain one); running the plain pass",
                stacklevel=3,
            )
    return _REPRODUCES[inner]
