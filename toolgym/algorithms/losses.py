"""Token-level policy-gradient losses over padded batches.

`token_logprobs` runs the model with its output head swapped for one that keeps the hidden
states, and applies the real head chunk by chunk under activation checkpointing, so
full-vocabulary float32 logits exist for one chunk at a time, in the forward and the backward
pass alike. The logit transforms some families apply after the head (soft-capping, scaling)
are applied per chunk too, and a one-time check per model falls back to full logits where the
chunked values would differ.

`policy_loss` computes, per sampled token (mask 1),

    ratio   = exp(logp - logp_old)                       (logp_old: the policy before the update)
    pg      = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) * w
    kl      = exp(ref - logp) - (ref - logp) - 1        (when beta > 0)
    token   = pg + beta * kl

where `w = min(exp(logp_old - logp_engine), cap)` corrects for the engine sampling from a
slightly different distribution (truncated importance sampling), and aggregates the tokens
as `loss_type` says (see `GRPOConfig.loss_type`). Masked tokens (prompt, tool results,
padding) count nowhere: not in the loss, not in the KL, not in any token count.

`toolgym.algorithms.fused_loss` computes the same loss with the head, the log-softmax and
these terms fused per chunk (`GRPOConfig.loss_impl`); `full_logprobs` is the reference path
over whole logits.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from toolgym.algorithms.prefix_sharing import (
    MIN_SHARED_TOKENS,
    give_up,
    prefix_sharing_works,
    shared_forward,
    shared_prefix_length,
)


@dataclass
class StepNormalizer:
    """Counts over the whole optimizer step, so that the loss does not depend on how the step
    is split into micro-batches (or processes)."""

    sequences: int
    """Trajectories that enter the loss."""
    tokens: float
    """Their sampled tokens."""
    micro_batches: int
    """Micro-batches in the step (for `bnpo`)."""
    max_tokens: int
    """The per-episode token budget (for `dr_grpo`)."""


class _Capture(nn.Module):
    """Stands in for the output head: keeps the hidden states it is given and returns a
    one-column stand-in, so whatever the model's forward does to its logits afterwards
    (soft-capping, scaling) costs nothing and changes nothing here."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []
        """The hidden states of each forward pass, in order."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.seen.append(hidden)
        return hidden[..., :1]


def _unwrap(model: Any) -> Any:
    while hasattr(model, "module"):  # accelerate / DDP wrappers
        model = model.module
    return model


@contextmanager
def _head_swapped_for_capture(model: Any) -> Iterator[tuple[Any, _Capture]]:
    """Temporarily replace the output head by a `_Capture`; yields (head, capture)."""
    inner = _unwrap(model)
    head = inner.get_output_embeddings()
    capture = _Capture()
    inner.set_output_embeddings(capture)
    try:
        yield head, capture
    finally:
        inner.set_output_embeddings(head)


@dataclass(frozen=True)
class LogitTransform:
    """What a model's forward does to the head's output before returning logits (the families
    that do anything: Gemma 2/3 soft-cap, Cohere multiplies, Granite divides)."""

    softcap: float | None = None
    multiplier: float = 1.0

    @classmethod
    def of(cls, model: Any) -> LogitTransform:
        """The transform `model`'s config declares (none for most families)."""
        config = getattr(_unwrap(model), "config", None)
        config = getattr(config, "text_config", None) or config
        softcap = getattr(config, "final_logit_softcapping", None)
        multiplier = float(getattr(config, "logit_scale", None) or 1.0)
        multiplier /= float(getattr(config, "logits_scaling", None) or 1.0)
        return cls(softcap=softcap or None, multiplier=multiplier)


def _scaled_logits(
    head: nn.Module, hidden: torch.Tensor, temperature: float, transform: LogitTransform
) -> torch.Tensor:
    return transformed_logits(head(hidden), temperature, transform)


def transformed_logits(
    logits: torch.Tensor, temperature: float, transform: LogitTransform
) -> torch.Tensor:
    """The head's output as the model's forward returns it, divided by `temperature`, in at
    least float32 (float64 stays float64)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if transform.multiplier != 1.0:
        logits = logits * transform.multiplier
    if transform.softcap is not None:
        logits = torch.tanh(logits / transform.softcap) * transform.softcap
    return logits / temperature if temperature != 1.0 else logits


def _chunk_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    transform: LogitTransform,
) -> torch.Tensor:
    return _gather_logprobs(_scaled_logits(head, hidden, temperature, transform), targets)


def _chunk_logprobs_by_logsumexp(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    transform: LogitTransform,
) -> torch.Tensor:
    logits = _scaled_logits(head, hidden, temperature, transform)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


@functools.cache
def _compiled_chunk_logprobs() -> Any:
    """The per-chunk logprobs through `torch.compile`: cast, scaling, log-sum-exp and gather
    fuse into a few kernels instead of several passes over float32 logits (one compilation
    for the first shape, one dynamic-shape graph for all others)."""
    return torch.compile(_chunk_logprobs_by_logsumexp)


CHUNK_LOGITS_BYTES = 256 * 2**20
"""The most float32 logits one chunk holds: a chunk has fewer positions than asked where the
vocabulary is large (256 for Gemma 3's 262,144 entries)."""


def chunk_positions(chunk_size: int, head: nn.Module) -> int:
    """Positions per chunk: `chunk_size`, capped so one chunk's float32 logits stay within
    `CHUNK_LOGITS_BYTES` for a head whose output width is known."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    weight = getattr(head, "weight", None)
    vocabulary = weight.shape[0] if isinstance(weight, torch.Tensor) else 0
    return max(1, min(chunk_size, CHUNK_LOGITS_BYTES // max(4 * vocabulary, 1)))


def compile_by_default(setting: bool | None, device: torch.device) -> bool:
    """`compile_logprobs` or `compile_model` resolved: None means on for CUDA devices only."""
    return device.type == "cuda" if setting is None else setting


_CHECKED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def chunked_logprobs_match(model: Any, input_ids: torch.Tensor) -> bool:
    """Whether head-by-chunk logprobs equal the model's own logits on a few of these tokens.

    A model whose forward transforms logits in a way `LogitTransform` does not know would
    otherwise train on wrong logprobs without a sign; the answer is kept per model."""
    inner = _unwrap(model)
    if inner not in _CHECKED:
        probe = input_ids[:1, :16]
        was_training = inner.training
        inner.eval()
        with torch.no_grad():
            logits = model(input_ids=probe, use_cache=False).logits[:, :-1]
            full_precision = logits.dtype in (torch.float32, torch.float64)
            full_precision = full_precision and not torch.is_autocast_enabled()
            expected = _gather_logprobs(logits.float(), probe[:, 1:])
            got = _chunked(model, probe, torch.ones_like(probe), 1024, 1.0, compiled=False)
        inner.train(was_training)
        tolerance = 1e-3 if full_precision else 0.1  # bf16 logits round to about 0.01
        _CHECKED[inner] = bool(torch.allclose(got.float(), expected, atol=tolerance))
        if not _CHECKED[inner]:
            warnings.warn(
                f"{type(inner).__name__}: the output head applied chunk by chunk does not "
                "reproduce the model's logits (an unknown logit transform); computing logprobs "
                "from full logits instead, which needs more memory",
                stacklevel=3,
            )
    return _CHECKED[inner]


def _gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    compiled: bool = False,
    share_prefix: bool = False,
) -> torch.Tensor:
    """Logprob of each token 1..L-1 given the ones before it: shape (B, L-1).

    Args:
        model: A transformers causal LM (possibly wrapped by accelerate or peft).
        input_ids, attention_mask: (B, L), right-padded.
        chunk_size: Positions whose logits exist at once.
        temperature: Logits are divided by it (the sampling temperature).
        compiled: Run the per-chunk head and log-softmax through `torch.compile` (faster on a
            GPU, where the float32 logits' memory traffic dominates; the first call compiles).
        share_prefix: Compute the rows' common prefix once (`captured_hidden`).
    """
    if not chunked_logprobs_match(model, input_ids):
        return full_logprobs(model, input_ids, attention_mask, temperature)
    return _chunked(
        model, input_ids, attention_mask, chunk_size, temperature, compiled, share_prefix
    )


def full_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """`token_logprobs` from the model's whole logits at once (the reference path: it holds
    `(B, L, vocabulary)` float32 logits, and their gradient in the backward pass)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logits = logits[:, :-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return _gather_logprobs(logits / temperature, input_ids[:, 1:])


def captured_hidden(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    share_prefix: bool = False,
) -> tuple[nn.Module, torch.Tensor]:
    """The model's output head and the hidden states it would be given, (B, L, width): the
    forward pass runs with the head swapped for a capture, so no logits are computed. With
    `share_prefix`, the rows' common prefix runs once (`toolgym.algorithms.prefix_sharing`)."""
    prefix = shared_prefix_length(input_ids, attention_mask) if share_prefix else 0
    inner = _unwrap(model)
    if prefix >= MIN_SHARED_TOKENS and prefix_sharing_works(
        inner, functools.partial(_probe_hidden, model)
    ):
        try:
            return _hidden_states(model, input_ids, attention_mask, prefix)
        except Exception as error:  # nothing was backpropagated yet: the plain pass instead
            give_up(inner, error)
    return _hidden_states(model, input_ids, attention_mask, 0)


def _hidden_states(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int
) -> tuple[nn.Module, torch.Tensor]:
    """`captured_hidden` with the rows' first `prefix` tokens run once (0: the plain pass)."""
    with _head_swapped_for_capture(model) as (head, capture):
        if prefix:
            shared_forward(model, _unwrap(model), input_ids, attention_mask, prefix)
        else:
            model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    if len(capture.seen) != (2 if prefix else 1):
        raise RuntimeError("the model's forward pass never reached its output head")
    if not prefix:
        return head, capture.seen[0]
    shared, own = capture.seen
    return head, torch.cat([shared.expand(own.shape[0], -1, -1), own], dim=1)


def _probe_hidden(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, share: bool
) -> torch.Tensor:
    prefix = shared_prefix_length(input_ids, attention_mask) if share else 0
    return _hidden_states(model, input_ids, attention_mask, prefix)[1]


def _chunked(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    chunk_size: int,
    temperature: float,
    compiled: bool,
    share_prefix: bool = False,
) -> torch.Tensor:
    transform = LogitTransform.of(model)
    per_chunk = _compiled_chunk_logprobs() if compiled else _chunk_logprobs
    head, hidden = captured_hidden(model, input_ids, attention_mask, share_prefix)
    hidden = hidden[:, :-1]
    targets = input_ids[:, 1:]
    batch, length, width = hidden.shape
    flat_hidden, flat_targets = hidden.reshape(-1, width), targets.reshape(-1)
    pieces = []
    step = chunk_positions(chunk_size, head)
    for start in range(0, flat_targets.numel(), step):
        h = flat_hidden[start : start + step]
        t = flat_targets[start : start + step]
        if torch.is_grad_enabled():
            pieces.append(
                checkpoint(per_chunk, head, h, t, temperature, transform, use_reentrant=False)
            )
        else:
            pieces.append(per_chunk(head, h, t, temperature, transform))
    return torch.cat(pieces).view(batch, length)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalizer: StepNormalizer,
    *,
    loss_type: str = "dapo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    importance_cap: float | None = None,
    episode_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and statistics for the logs.

    Args:
        logprobs: (B, T) the trainer's logprobs of the sampled tokens (with grad).
        old_logprobs: (B, T) the same before the update (no grad).
        advantages: (B,) one per trajectory, or (B, T) one per token.
        mask: (B, T) 1.0 on sampled tokens that enter the loss.
        normalizer: Counts over the whole step.
        loss_type: "grpo", "dr_grpo", "dapo" or "bnpo".
        clip_low, clip_high: Clip range of the ratio.
        beta: KL coefficient (needs `ref_logprobs`).
        ref_logprobs: (B, T) the reference model's logprobs.
        sampling_logprobs: (B, T) the engine's logprobs, for importance sampling.
        importance_cap: Cap of the importance weight (None: no correction).
        episode_tokens: (B,) sampled tokens of each row's whole episode, for `grpo` (rows that
            are one turn of an episode are averaged over the episode); default: the row's own.
    """
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs the reference model's logprobs")
    advantage = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    weight = importance_weight(old_logprobs, sampling_logprobs, importance_cap)
    terms = token_terms(
        logprobs, old_logprobs, advantage, clip_low, clip_high, weight, beta, ref_logprobs
    )
    loss = aggregate(terms.loss * mask, mask, normalizer, loss_type, episode_tokens)
    return loss, terms.stats(mask)


def importance_weight(
    old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor | None, cap: float | None
) -> torch.Tensor | None:
    """The truncated importance weight `min(exp(logp_old - logp_engine), cap)`, detached
    (None: no correction)."""
    if cap is None or sampling_logprobs is None:
        return None
    return torch.exp(old_logprobs - sampling_logprobs).clamp(max=cap).detach()


@dataclass
class TokenTerms:
    """The per-token pieces of the policy loss (all (B, T) or one chunk's (N,))."""

    loss: torch.Tensor
    """`pg * w + beta * kl`, not yet masked."""
    unclipped: torch.Tensor
    clipped: torch.Tensor
    weight: torch.Tensor | None
    kl: torch.Tensor | None

    def stats(self, mask: torch.Tensor) -> dict[str, float]:
        """Masked means for the logs: `clip_fraction`, and `is_weight` and `kl` where used."""
        denominator = mask.sum().clamp(min=1)
        stats: dict[str, float] = {}
        if self.weight is not None:
            stats["is_weight"] = ((self.weight * mask).sum() / denominator).item()
        if self.kl is not None:
            stats["kl"] = ((self.kl * mask).sum() / denominator).item()
        was_clipped = ((self.unclipped - self.clipped).abs() > 0).float()
        stats["clip_fraction"] = ((was_clipped * mask).sum() / denominator).item()
        return stats


def token_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantage: torch.Tensor,
    clip_low: float,
    clip_high: float,
    weight: torch.Tensor | None,
    beta: float,
    ref_logprobs: torch.Tensor | None,
) -> TokenTerms:
    """Each token's clipped, importance-weighted policy-gradient term plus its KL term (the
    formula in this module's docstring); `advantage` has the shape of `logprobs`."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantage
    per_token = -torch.min(unclipped, clipped)
    if weight is not None:
        per_token = per_token * weight
    kl = None
    if beta > 0 and ref_logprobs is not None:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
    return TokenTerms(per_token, unclipped, clipped, weight, kl)


def aggregate(
    masked: torch.Tensor,
    mask: torch.Tensor,
    normalizer: StepNormalizer,
    loss_type: str,
    episode_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token losses (already masked) -> this micro-batch's share of the step loss, as
    `loss_type` normalises it (see `GRPOConfig.loss_type`)."""
    if loss_type == "grpo":
        lengths = mask.sum(1) if episode_tokens is None else episode_tokens
        per_sequence = masked.sum(1) / lengths.clamp(min=1)
        return per_sequence.sum() / max(normalizer.sequences, 1)
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1) / max(normalizer.micro_batches, 1)
    if loss_type == "dapo":
        return masked.sum() / max(normalizer.tokens, 1.0)
    if loss_type == "dr_grpo":
        return masked.sum() / max(normalizer.sequences * normalizer.max_tokens, 1)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def aggregation_weights(
    mask: torch.Tensor,
    normalizer: StepNormalizer,
    loss_type: str,
    episode_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each token's weight in `aggregate`: `aggregate(x * mask, ...)` equals
    `(x * aggregation_weights(mask, ...)).sum()` for any per-token `x`."""
    if loss_type == "grpo":
        lengths = mask.sum(1) if episode_tokens is None else episode_tokens
        return mask / lengths.clamp(min=1).unsqueeze(1) / max(normalizer.sequences, 1)
    if loss_type == "bnpo":
        return mask / mask.sum().clamp(min=1) / max(normalizer.micro_batches, 1)
    if loss_type == "dapo":
        return mask / max(normalizer.tokens, 1.0)
    if loss_type == "dr_grpo":
        return mask / max(normalizer.sequences * normalizer.max_tokens, 1)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def masked_nll(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the masked tokens (the SFT loss)."""
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)
