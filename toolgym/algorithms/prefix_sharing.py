"""A micro-batch's common prompt prefix computed once (`GRPOConfig.share_prefix`).

The rows of an update's micro-batch usually open with the same tokens: every episode of a
group, often of a whole step, starts with the same system prompt, tool schemas and task. The
plain forward pass computes those positions once per row. Here the longest prefix that every
row shares runs once, as a batch of one, keeping each layer's keys and values; then the rows'
own tokens run as a batch that attends to those keys and values (broadcast to every row). The
hidden states are the plain pass's (the same function of the same inputs, in another order of
operations), and the gradient flows back through the shared keys and values into the prefix
pass, so the loss and its gradient are the plain path's up to rounding
(`tests/test_algorithms/test_prefix_sharing.py` compares them in float64).

Both passes use cache layers that never grow: the prefix pass keeps the first keys and values
a layer gives it, the rows' pass prepends the prefix's without storing anything, so a layer
that gradient checkpointing replays in the backward pass computes the same thing again.
A model runs the plain pass instead, with a warning, when its structure rules sharing out
(`why_not_shareable`: a cache that is not plain full attention, rotary scaling that depends on
each call's length, dropout, FSDP), when a one-time probe finds different hidden states or
gradients (`prefix_sharing_works`), or when the shared pass fails in training.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_SHARED_TOKENS = 8
"""A shorter common prefix is not worth a second forward call."""


def share_prefix_by_default(setting: bool | None, device: torch.device) -> bool:
    """`GRPOConfig.share_prefix` resolved: None means on except on CUDA devices."""
    return device.type != "cuda" if setting is None else setting


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading tokens every row of a batch shares (0 for one row), within the leading
    columns where every row is a real token and short of the last of them, so that every row
    keeps at least one token of its own."""
    if input_ids.shape[0] < 2:
        return 0
    real = int(attention_mask.bool().all(0).long().cumprod(0).sum())
    same = (input_ids[:, :real] == input_ids[:1, :real]).all(0)
    differs = (~same).nonzero()
    common = int(differs[0]) if len(differs) else real
    return max(0, min(common, real - 1))


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


def why_not_shareable(inner: Any) -> str | None:
    """Why `inner` (an unwrapped causal LM) cannot share prefixes by its structure, or None."""
    config = inner.config
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config the cache cannot read
        layers = []
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return "its cache is not plain full attention (sliding windows, recurrent state)"
    text = getattr(config, "text_config", None) or config
    if _rope_types(text) & {"dynamic", "longrope"}:
        return "its rotary embedding rescales with each call's length"
    dropouts = [v for k, v in vars(text).items() if k.endswith("dropout") and isinstance(v, float)]
    dropouts += [m.p for m in inner.modules() if isinstance(m, torch.nn.Dropout)]
    if any(p > 0 for p in dropouts):
        return "it has dropout (every row would share the prefix's dropout mask)"
    if any(type(m).__name__.startswith("FSDP") for m in inner.modules()):
        return "FSDP reduces a layer's gradients before the prefix pass's share reaches them"
    return None


def _rope_types(config: Any) -> set[str]:
    found: set[str] = set()
    pending = [getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            kind = item.get("rope_type") or item.get("type")
            if isinstance(kind, str):
                found.add(kind)
            pending.extend(v for v in item.values() if isinstance(v, dict))
    return found


@contextmanager
def _cache_kept_under_checkpointing(model: Any) -> Iterator[None]:
    """Let checkpointed decoder layers keep the cache (ours is safe to replay)."""
    name = "_can_checkpoint_with_cache"
    layers = [m for m in model.modules() if hasattr(type(m), name)]
    before = [vars(layer).get(name, _MISSING) for layer in layers]
    for layer in layers:
        setattr(layer, name, True)
    try:
        yield
    finally:
        for layer, value in zip(layers, before, strict=True):
            if value is _MISSING:
                delattr(layer, name)
            else:
                setattr(layer, name, value)


_MISSING = object()


def shared_forward(
    model: Any, inner: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int
) -> None:
    """Run `model` on a right-padded batch whose rows share their first `prefix` tokens: the
    prefix once (through `inner`, the unwrapped model, so a DDP wrapper sees one forward per
    backward), then the rows' remaining tokens (what the passes return is left to hooks and
    head captures: the prefix pass's positions are the first of every row)."""
    config = inner.config
    cache = DynamicCache(config=config)
    recording = [_RecordingLayer() for _ in cache.layers]
    with _cache_kept_under_checkpointing(inner):
        cache.layers = list(recording)
        inner(
            input_ids=input_ids[:1, :prefix],
            attention_mask=attention_mask[:1, :prefix],
            past_key_values=cache,
            use_cache=False,  # the given cache is read and written all the same
        )
        if any(layer.recorded is None for layer in recording):
            raise RuntimeError("a layer of the prefix pass never reached its cache")
        cache.layers = [_PrefixLayer(*layer.recorded) for layer in recording]  # type: ignore[misc]
        model(
            input_ids=input_ids[:, prefix:],
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=False,
        )


_REPRODUCES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

HiddenStates = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]
"""(input_ids, attention_mask, share) -> (B, L, width) hidden states."""


def prefix_sharing_works(inner: Any, run: HiddenStates) -> bool:
    """Whether `inner` (an unwrapped causal LM) shares prefixes: nothing in its structure
    forbids it (`why_not_shareable`) and, on a small probe in training mode under the caller's
    autocast, `run` gives the same hidden states and the same gradients of the first
    parameters with and without sharing; the answer is kept per model (one warning if not)."""
    if inner not in _REPRODUCES:
        reason = why_not_shareable(inner)
        if reason is None:
            try:
                reason = _probe(inner, run)
            except Exception as error:  # any failure means: do not share
                reason = f"the shared pass failed on a probe ({type(error).__name__}: {error})"
        _REPRODUCES[inner] = reason is None
        if reason is not None:
            warn_plain(inner, reason)
    return _REPRODUCES[inner]


def give_up(inner: Any, error: Exception) -> None:
    """The shared pass failed in training: the model runs the plain pass from now on."""
    _REPRODUCES[inner] = False
    warn_plain(inner, f"the shared pass failed ({type(error).__name__}: {error})")


def warn_plain(inner: Any, reason: str) -> None:
    """Warn once that `inner` runs the plain pass, and why."""
    warnings.warn(
        f"{type(inner).__name__}: the micro-batch's common prefix is not computed once for "
        f"this model ({reason}); running the plain pass",
        stacklevel=4,
    )


def _probe(inner: Any, run: HiddenStates) -> str | None:
    """Compare the shared pass with the plain one on two rows; None if they agree."""
    generator = torch.Generator().manual_seed(0)
    vocabulary = inner.get_input_embeddings().num_embeddings
    ids = torch.randint(vocabulary, (2, 2 * MIN_SHARED_TOKENS + 4), generator=generator)
    ids[1, : MIN_SHARED_TOKENS + 2] = ids[0, : MIN_SHARED_TOKENS + 2]
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    device = inner.get_input_embeddings().weight.device
    ids, mask = ids.to(device), mask.to(device)
    params = [p for p in inner.parameters() if p.requires_grad][:4]
    low_precision = torch.is_autocast_enabled(device.type) or any(
        p.dtype in (torch.float16, torch.bfloat16) for p in params
    )
    tolerance = 5e-2 if low_precision else 1e-3
    results = []
    was_training = inner.training
    inner.train()  # as in the update: checkpointed layers replay (dropout is ruled out above)
    try:
        with torch.enable_grad():
            for share in (False, True):
                hidden = run(ids, mask, share)
                weights = torch.randn(hidden.shape, generator=generator.manual_seed(1))
                loss = (hidden.float() * weights.to(device) * mask[..., None]).sum()
                grads = torch.autograd.grad(loss, params, allow_unused=True) if params else ()
                results.append((hidden.detach().float(), grads))
    finally:  # a probe that raises leaves the model in the mode it found it in
        inner.train(was_training)
    (plain, plain_grads), (shared, shared_grads) = results
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        if _relative(shared[row][real], plain[row][real]) > tolerance:
            return "the shared pass's hidden states differ from the plain pass's on a probe"
    for got, expected in zip(shared_grads, plain_grads, strict=True):
        if (got is None) != (expected is None) or (
            got is not None and _relative(got.float(), expected.float()) > tolerance
        ):
            return "the shared pass's gradients differ from the plain pass's on a probe"
    return None


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm().clamp_min(1e-12))
