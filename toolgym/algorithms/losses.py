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

The field's variants, each a setting of `LossSettings` (and of `GRPOConfig`):
- the weight `w` per token or per row (`exp` of the row's summed log-differences), clamped to
  [C_min, C_max] ("truncate") or zeroed outside it ("mask"), as TRL's
  `vllm_importance_sampling_mode`;
- GSPO's sequence ratio (`ratio_level="sequence"`): `ratio = exp(mean over the row's tokens
  of (logp - logp_old))`, one per row, in the clipped objective;
- CISPO (`loss_type="cispo"`): `pg = -sg(min(ratio, cispo_cap)) * A * logp`, aggregated as
  "dapo";
- DeepSeek-V3.2's off-policy sequence mask (OPSM): `pg` is dropped for rows with a negative
  advantage whose mean `logp_engine - logp` exceeds `off_policy_threshold`.
`pg` is multiplied by the OPSM mask and by `w` before the KL term is added, as in TRL.

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
from dataclasses import dataclass, field
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


IMPORTANCE_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""How the engine/trainer mismatch is corrected (TRL's `vllm_importance_sampling_mode`)."""
RATIO_LEVELS = ("token", "sequence")
"""Whose probability ratio the clipped objective reads: each token's, or the sequence's
length-normalised one (GSPO)."""


@dataclass(frozen=True)
class LossSettings:
    """The loss's scalar settings (see `policy_loss` and `GRPOConfig`'s fields of the same
    meaning)."""

    loss_type: str = "dapo"
    """"grpo", "dr_grpo", "dapo", "bnpo" (the clipped objective, aggregated as named) or
    "cispo" (`-sg(min(ratio, cispo_cap)) * A * logp`, aggregated as "dapo")."""
    clip_low: float = 0.2
    """The ratio's clip range is [1 - clip_low, 1 + clip_high]."""
    clip_high: float = 0.2
    beta: float = 0.0
    """KL coefficient (needs the reference model's logprobs)."""
    importance_cap: float | None = None
    """C_max of the engine/trainer importance weight `exp(logp_old - logp_engine)` (None: no
    upper bound)."""
    importance_floor: float | None = None
    """C_min (None: no lower bound). With neither bound there is no correction."""
    importance_mode: str = "token_truncate"
    """"token_truncate" (each token's weight clamped to the bounds), "token_mask" (0 outside
    them), "sequence_truncate" / "sequence_mask" (the same for one weight per row, from the
    sum of the row's log-differences)."""
    ratio_level: str = "token"
    """"token", or "sequence" (GSPO: one ratio per row, `exp` of the mean of the row's
    log-ratios, clipped and broadcast to its tokens)."""
    off_policy_threshold: float | None = None
    """DeepSeek-V3.2's off-policy sequence mask (OPSM): drop a negative-advantage sequence whose
    mean per-token KL from the sampler exceeds this (None: off)."""
    cispo_cap: float = 5.0
    """CISPO's cap of the (detached) ratio (ScaleRL's epsilon_max)."""
    kl_bias_correction: bool = False
    """Multiply the KL term by the ratio (TRL's `use_bias_correction_kl`), so that its gradient
    is an unbiased estimate of the reverse KL's under samples from the old policy."""
    temperature: float = 1.0
    transform: LogitTransform = field(default_factory=LogitTransform)

    def __post_init__(self) -> None:
        if self.loss_type not in ("grpo", "dr_grpo", "dapo", "bnpo", "cispo"):
            raise ValueError(f"unknown loss_type {self.loss_type!r}")
        if self.importance_mode not in IMPORTANCE_MODES:
            raise ValueError(
                f"unknown importance_mode {self.importance_mode!r}; "
                f"expected one of {', '.join(IMPORTANCE_MODES)}"
            )
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(
                f"unknown ratio_level {self.ratio_level!r}; expected token or sequence"
            )

    @property
    def corrects(self) -> bool:
        """Whether the engine/trainer importance weight is applied."""
        return self.importance_cap is not None or self.importance_floor is not None

    @property
    def whole_sequences(self) -> bool:
        """Whether a token's loss depends on the rest of its sequence (a sequence-level ratio
        or weight, or OPSM): such losses need every logprob of a row before any token's term,
        so they are computed from whole logprobs (`loss_impl="chunked"` or "full")."""
        sequence_weight = self.corrects and self.importance_mode.startswith("sequence")
        return (
            self.ratio_level == "sequence"
            or sequence_weight
            or self.off_policy_threshold is not None
        )


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalizer: StepNormalizer,
    *,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    episode_tokens: torch.Tensor | None = None,
    **settings: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and statistics for the logs.

    Args:
        logprobs: (B, T) the trainer's logprobs of the sampled tokens (with grad).
        old_logprobs: (B, T) the same before the update (no grad).
        advantages: (B,) one per trajectory, or (B, T) one per token.
        mask: (B, T) 1.0 on sampled tokens that enter the loss.
        normalizer: Counts over the whole step.
        ref_logprobs: (B, T) the reference model's logprobs (for `beta` > 0).
        sampling_logprobs: (B, T) the engine's logprobs: the importance weight, OPSM and the
            mismatch figures.
        episode_tokens: (B,) sampled tokens of each row's whole episode, for `grpo` (rows that
            are one turn of an episode are averaged over the episode); default: the row's own.
        settings: `LossSettings` fields (`loss_type`, `clip_low`, `clip_high`, `beta`, the
            importance weight's bounds and mode, `ratio_level`, OPSM, CISPO, KL correction).
    """
    config = LossSettings(**settings)
    if config.beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs the reference model's logprobs")
    advantage = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    terms = loss_terms(
        logprobs, old_logprobs, advantage, config, ref_logprobs, sampling_logprobs, mask
    )
    loss = aggregate(terms.loss * mask, mask, normalizer, config.loss_type, episode_tokens)
    return loss, terms.stats(mask) | mismatch_stats(old_logprobs, sampling_logprobs, mask)


def importance_weight(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor | None,
    settings: LossSettings,
    mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The engine/trainer importance weight from `exp(logp_old - logp_engine)`, detached:
    (B, T) per token, or (B, 1) per row in the sequence modes (which need `mask`); None: no
    correction. Tokens the engine gave no logprob for (NaN) weigh 1."""
    if not settings.corrects or sampling_logprobs is None:
        return None
    gap = torch.nan_to_num(old_logprobs - sampling_logprobs, nan=0.0).detach()
    if settings.importance_mode.startswith("sequence"):
        if mask is None:
            raise ValueError("a sequence-level importance weight needs the mask")
        gap = (gap * mask).sum(-1, keepdim=True)
    ratio = torch.exp(gap)
    low, high = settings.importance_floor, settings.importance_cap
    if settings.importance_mode.endswith("truncate"):
        return ratio.clamp(min=low, max=high)
    outside = torch.zeros_like(ratio, dtype=torch.bool)
    if low is not None:
        outside |= ratio < low
    if high is not None:
        outside |= ratio > high
    return ratio.masked_fill(outside, 0.0)


def off_policy_keep(
    advantage: torch.Tensor,
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask: 1 where a token's advantage is not negative or
    its row's mean `logp_engine - logp` over sampled tokens is at most `threshold`, else 0
    (detached; (B, 1) or (B, T) as `advantage`). Tokens without an engine logprob count 0."""
    gap = torch.nan_to_num(sampling_logprobs - logprobs.detach(), nan=0.0)
    mean_gap = (gap * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return ((advantage >= 0) | (mean_gap <= threshold)).to(logprobs.dtype)


@dataclass
class TokenTerms:
    """The per-token pieces of the policy loss (all (B, T) or one chunk's (N,); a sequence-level
    ratio or weight is (B, 1), broadcast)."""

    loss: torch.Tensor
    """`pg * keep * w + beta * kl`, not yet masked."""
    unclipped: torch.Tensor
    clipped: torch.Tensor
    weight: torch.Tensor | None
    kl: torch.Tensor | None
    kept: torch.Tensor | None = None
    """OPSM's mask (1 keep, 0 drop), where on."""
    masks_weights: bool = False
    """Whether a weight of 0 means the importance mask dropped the token."""

    def stats(self, mask: torch.Tensor) -> dict[str, float]:
        """Masked means for the logs: `clip_fraction`, and where used `is_weight`,
        `is_masked` (tokens the importance mask zeroed), `off_policy_masked` (tokens OPSM
        dropped) and `kl`."""
        denominator = mask.sum().clamp(min=1)

        def mean(values: torch.Tensor) -> float:
            return float((values.detach() * mask).sum() / denominator)

        stats: dict[str, float] = {}
        if self.weight is not None:
            stats["is_weight"] = mean(self.weight)
            if self.masks_weights:
                stats["is_masked"] = mean((self.weight == 0).to(mask.dtype))
        if self.kept is not None:
            stats["off_policy_masked"] = mean(1 - self.kept)
        if self.kl is not None:
            stats["kl"] = mean(self.kl)
        stats["clip_fraction"] = mean(((self.unclipped - self.clipped).abs() > 0).to(mask.dtype))
        return stats


def loss_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantage: torch.Tensor,
    settings: LossSettings,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> TokenTerms:
    """Each token's loss term (the formula in this module's docstring, with the settings'
    ratio level, importance mode, OPSM and CISPO); `advantage` broadcasts to `logprobs`.
    Settings that need whole sequences (`LossSettings.whole_sequences`) need `mask`."""
    if settings.whole_sequences and mask is None:
        raise ValueError("a sequence-level ratio, weight or OPSM needs whole rows and their mask")
    log_ratio = logprobs - old_logprobs
    if settings.ratio_level == "sequence":
        assert mask is not None
        log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(
            min=1
        )
    ratio = torch.exp(log_ratio)
    if settings.loss_type == "cispo":
        unclipped = ratio * advantage
        capped = ratio.clamp(max=settings.cispo_cap)
        clipped = capped * advantage
        per_token = -capped.detach() * advantage * logprobs
    else:
        unclipped = ratio * advantage
        clipped = torch.clamp(ratio, 1 - settings.clip_low, 1 + settings.clip_high) * advantage
        per_token = -torch.min(unclipped, clipped)
    kept = None
    if settings.off_policy_threshold is not None:
        assert mask is not None
        sampler = old_logprobs if sampling_logprobs is None else sampling_logprobs
        kept = off_policy_keep(advantage, logprobs, sampler, mask, settings.off_policy_threshold)
        per_token = per_token * kept
    weight = importance_weight(old_logprobs, sampling_logprobs, settings, mask)
    if weight is not None:
        per_token = per_token * weight
    kl = None
    if settings.beta > 0 and ref_logprobs is not None:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1
        if settings.kl_bias_correction:
            kl = kl * ratio
        per_token = per_token + settings.beta * kl
    masks = settings.importance_mode.endswith("mask")
    return TokenTerms(per_token, unclipped, clipped, weight, kl, kept, masks)


def mismatch_stats(
    old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor | None, mask: torch.Tensor
) -> dict[str, float]:
    """How far the engine's sampling distribution is from the trainer's, over the sampled
    tokens (logged whether or not a correction is on), with `d = logp_trainer - logp_engine`:
    `mismatch_kl`, the mean of `exp(d) - d - 1` (the k3 estimate of KL(engine || trainer)),
    and `mismatch_abs`, the mean of `|d|`. Tokens without an engine logprob are left out."""
    if sampling_logprobs is None:
        return {}
    gap = (old_logprobs - sampling_logprobs).detach()
    scored = mask * (~torch.isnan(gap)).to(mask.dtype)
    gap = torch.nan_to_num(gap, nan=0.0)
    count = scored.sum()
    if count == 0:
        return {}
    k3 = (torch.exp(gap) - gap - 1).clamp(min=0)  # >= 0; rounding makes tiny negatives
    return {
        "mismatch_kl": float((k3 * scored).sum() / count),
        "mismatch_abs": float((gap.abs() * scored).sum() / count),
    }


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
    if loss_type in ("dapo", "cispo"):
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
    if loss_type in ("dapo", "cispo"):
        return mask / max(normalizer.tokens, 1.0)
    if loss_type == "dr_grpo":
        return mask / max(normalizer.sequences * normalizer.max_tokens, 1)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def masked_nll(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the masked tokens (the SFT loss)."""
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)
