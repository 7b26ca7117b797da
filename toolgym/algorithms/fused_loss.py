"""The policy loss fused with the output head, chunk by chunk, forward and backward at once.

`fused_policy_loss` gives the loss and gradients of `token_logprobs` followed by
`policy_loss`, without logits for more than one chunk of positions at any time and without
recomputing them in the backward pass. The model runs with its head swapped for a capture
(`losses.captured_hidden`); then, for each chunk of `chunk_size` positions, the head, the
post-head transforms (soft-capping, scaling, temperature), the log-softmax, the gather, the
ratio, the clipping, the importance weight, the KL and the mask-and-normalisation weight of
`aggregate` make that chunk's share of the loss, and its gradients with respect to the chunk's
hidden states and the head's parameters are taken at once (`torch.autograd.grad`). The chunk's
logits and their graph are dropped before the next chunk; the backward pass only scales the
stored gradients and sends the hidden states' on into the model. This is the scheme of
Liger-Kernel's fused linear losses, written so `torch.compile` can fuse each chunk's
elementwise work (`compiled=True`).

Kept between forward and backward: the hidden states' gradient (positions x width) and the
head's (vocabulary x width, which the backward pass would allocate anyway). Per chunk, the
head's matrix product runs three times (logits, their gradient to the hidden states and to the
weights) instead of four (checkpointed chunks recompute the logits).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.func import functional_call

from toolgym.algorithms.losses import (
    LogitTransform,
    LossSettings,
    StepNormalizer,
    aggregation_weights,
    captured_hidden,
    chunk_positions,
    chunked_logprobs_match,
    full_logprobs,
    loss_terms,
    mismatch_stats,
    policy_loss,
    token_logprobs,
    transformed_logits,
)

LossImpl = Literal["auto", "fused", "chunked", "full"]
LOSS_IMPLS = ("auto", "fused", "chunked", "full")


def resolve_loss_impl(setting: str, whole_sequences: bool = False) -> str:
    """`GRPOConfig.loss_impl` resolved: "auto" is "fused" on every device (it falls back to
    full logits by itself where the head applied by chunks would not reproduce the model's
    logits), and "chunked" where the loss needs whole sequences' logprobs before any token's
    term (`LossSettings.whole_sequences`: a sequence-level ratio or weight, OPSM)."""
    if setting not in LOSS_IMPLS:
        raise ValueError(f"unknown loss_impl {setting!r}; expected one of {', '.join(LOSS_IMPLS)}")
    if setting == "fused" and whole_sequences:
        raise ValueError(
            'loss_impl="fused" computes each chunk of tokens on its own, but a sequence-level '
            "ratio or importance weight, or OPSM, needs each row's whole logprobs: use "
            'loss_impl="auto" or "chunked"'
        )
    if setting == "auto":
        return "chunked" if whole_sequences else "fused"
    return setting


def _chunk_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    advantage: torch.Tensor,
    old: torch.Tensor | None,
    ref: torch.Tensor | None,
    sampling: torch.Tensor | None,
    settings: LossSettings,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's share of the loss (with grad) and its logprobs (detached), from the head's
    raw output."""
    logits = transformed_logits(logits, settings.temperature, settings.transform)
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logprobs = chosen - torch.logsumexp(logits, -1)
    old = logprobs.detach() if old is None else old
    terms = loss_terms(logprobs, old, advantage, settings, ref, sampling)
    return (terms.loss * weights).sum(), logprobs.detach()


@functools.cache
def _compiled_chunk_loss() -> Any:
    """`_chunk_loss` through `torch.compile`: transforms, log-sum-exp, gather and the loss
    terms fuse into a few kernels, backward included."""
    return torch.compile(_chunk_loss)


@dataclass
class _Plan:
    """What the fused function needs besides the tensors autograd tracks."""

    head: nn.Module
    names: list[str]
    per_token: dict[str, Any]
    """The per-token tensors (flat), or None where a term is off."""
    settings: LossSettings
    chunk_size: int
    compiled: bool


class _FusedHeadLoss(torch.autograd.Function):
    """(hidden (N, width), head parameters) -> (loss, logprobs (N,) detached); the gradients
    are computed in the forward pass, chunk by chunk, and only scaled in the backward."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, plan: _Plan, *params: torch.Tensor) -> Any:
        per_chunk = _compiled_chunk_loss() if plan.compiled else _chunk_loss
        wants = [hidden.requires_grad, *(p.requires_grad for p in params)]
        grads = [
            torch.zeros_like(t) if w else None
            for t, w in zip((hidden, *params), wants, strict=True)
        ]
        by_hand = _plain_linear(plan.head, hidden)
        losses, pieces = [], []
        step = chunk_positions(plan.chunk_size, plan.head)
        for start in range(0, hidden.shape[0], step):
            part = slice(start, start + step)
            chunk: dict[str, Any] = {
                k: None if v is None else v[part] for k, v in plan.per_token.items()
            }
            chunk_loss = functools.partial(per_chunk, settings=plan.settings, **chunk)
            if by_hand:
                loss, logprobs = _linear_chunk(chunk_loss, hidden[part], params, grads, part)
            else:
                loss, logprobs = _module_chunk(chunk_loss, plan, hidden[part], params, grads, part)
            losses.append(loss)
            pieces.append(logprobs)
        ctx.grads = grads
        logprobs = torch.cat(pieces)
        ctx.mark_non_differentiable(logprobs)
        return torch.stack(losses).sum(), logprobs

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _: Any) -> Any:
        grads, ctx.grads = ctx.grads, None
        if not bool(grad_loss == 1):  # the buffers are this function's own: scale in place
            grads = tuple(None if g is None else g.mul_(grad_loss.to(g.dtype)) for g in grads)
        return grads[0], None, *grads[1:]


def _plain_linear(head: nn.Module, hidden: torch.Tensor) -> bool:
    """Whether the head is a bare `nn.Linear` outside autocast: its gradients are then taken
    by hand, accumulated in place (no chunk-sized copy of the weight's gradient)."""
    if type(head) is not nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return False
    return head.weight.dtype == hidden.dtype and not torch.is_autocast_enabled(hidden.device.type)


def _linear_chunk(
    chunk_loss: Any, h: torch.Tensor, params: tuple[torch.Tensor, ...], grads: list, part: slice
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk through a bare linear head: the loss's gradient to the logits by autograd,
    then to the hidden states and the head's weight and bias by matrix products."""
    weight, bias = params[0], params[1] if len(params) > 1 else None
    with torch.enable_grad():
        logits = nn.functional.linear(h, weight, bias).requires_grad_()
        loss, logprobs = chunk_loss(logits)
        (grad_logits,) = torch.autograd.grad(loss, [logits])
    if grads[0] is not None:
        torch.matmul(grad_logits, weight, out=grads[0][part])
    if grads[1] is not None:
        grads[1].addmm_(grad_logits.T, h)
    if bias is not None and grads[2] is not None:
        grads[2] += grad_logits.sum(0)
    return loss.detach(), logprobs


def _module_chunk(
    chunk_loss: Any,
    plan: _Plan,
    h: torch.Tensor,
    params: tuple[torch.Tensor, ...],
    grads: list,
    part: slice,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk through any head module (LoRA-wrapped, hooked, under autocast): the
    gradients to the chunk's hidden states and the head's parameters by autograd."""
    wants = [g is not None for g in grads]
    with torch.enable_grad():
        h = h.detach().requires_grad_(wants[0])
        local = [p.detach().requires_grad_(w) for p, w in zip(params, wants[1:], strict=True)]
        logits = functional_call(plan.head, dict(zip(plan.names, local, strict=True)), (h,))
        loss, logprobs = chunk_loss(logits)
        inputs = [t for t in (h, *local) if t.requires_grad]
        found = list(torch.autograd.grad(loss, inputs)) if inputs else []
    if grads[0] is not None:
        grads[0][part] = found.pop(0)
    for total, grad in zip([g for g in grads[1:] if g is not None], found, strict=True):
        total += grad
    return loss.detach(), logprobs


def fused_policy_loss(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalizer: StepNormalizer,
    *,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    episode_tokens: torch.Tensor | None = None,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    compiled: bool = False,
    share_prefix: bool = False,
    **fields: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`policy_loss(token_logprobs(model, ...), ...)`, fused per chunk (see the module).

    Args:
        model: A transformers causal LM (possibly wrapped by accelerate or peft).
        input_ids, attention_mask: (B, L), right-padded.
        old_logprobs: (B, L-1) before the update; None: this pass's own, detached (one pass).
        advantages, mask, normalizer, ref_logprobs, sampling_logprobs, episode_tokens: as for
            `policy_loss` (`mask` and the per-token tensors cover positions 1..L-1).
        chunk_size, temperature, compiled, share_prefix: as for `token_logprobs`.
        fields: `LossSettings` fields, as for `policy_loss`; those that need whole rows
            (`LossSettings.whole_sequences`) are refused.

    Returns the loss and `policy_loss`'s statistics. A model whose logits the head applied by
    chunks does not reproduce (`chunked_logprobs_match`) gets the full-logits path instead.
    """
    settings = LossSettings(**fields, temperature=temperature)
    if settings.beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs the reference model's logprobs")
    resolve_loss_impl("fused", settings.whole_sequences)  # refuses what needs whole rows
    if not chunked_logprobs_match(model, input_ids):
        logprobs = full_logprobs(model, input_ids, attention_mask, temperature)
        old = logprobs.detach() if old_logprobs is None else old_logprobs
        return policy_loss(
            logprobs,
            old,
            advantages,
            mask,
            normalizer,
            ref_logprobs=ref_logprobs,
            sampling_logprobs=sampling_logprobs,
            episode_tokens=episode_tokens,
            **fields,
        )
    sampling = sampling_logprobs if settings.corrects else None
    advantage = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    per_token: dict[str, torch.Tensor | None] = dict(advantage=advantage.expand_as(mask))
    per_token |= dict(old=old_logprobs, ref=ref_logprobs if settings.beta > 0 else None)
    per_token["sampling"] = sampling
    logprobs, loss = _fused(
        model,
        input_ids,
        attention_mask,
        mask,
        normalizer,
        episode_tokens,
        per_token,
        replace(settings, transform=LogitTransform.of(model)),
        chunk_size,
        compiled,
        share_prefix,
    )
    # the figures for the logs, from the same logprobs (no gradient, (B, T) only)
    old = logprobs if old_logprobs is None else old_logprobs
    terms = loss_terms(logprobs, old, advantage, settings, ref_logprobs, sampling_logprobs, mask)
    return loss, terms.stats(mask) | mismatch_stats(old, sampling_logprobs, mask)


def _fused(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    normalizer: StepNormalizer,
    episode_tokens: torch.Tensor | None,
    per_token: dict[str, torch.Tensor | None],
    settings: LossSettings,
    chunk_size: int,
    compiled: bool,
    share_prefix: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's hidden states through `_FusedHeadLoss`: ((B, L-1) logprobs, the loss)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    head, hidden = captured_hidden(model, input_ids, attention_mask, share_prefix)
    hidden = hidden[:, :-1]
    batch, length, width = hidden.shape
    # the weights in the logits' precision (float32 or wider), in which `aggregate` divides
    precision = torch.promote_types(mask.dtype, torch.promote_types(hidden.dtype, torch.float32))
    weights = aggregation_weights(
        mask.to(precision), normalizer, settings.loss_type, episode_tokens
    )
    per_token = per_token | dict(targets=input_ids[:, 1:], weights=weights)
    # only the positions the loss reads (sampled tokens) go through the head: prompt,
    # observation and padding positions have weight 0, their logits would change nothing
    kept = mask.reshape(-1).nonzero().squeeze(1)
    unread = kept.numel() == 0
    if unread:  # nothing enters the loss: one position (weight 0) keeps every gradient defined
        kept = kept.new_zeros(1)
    named = list(head.named_parameters())
    plan = _Plan(
        head=head,
        names=[n for n, _ in named],
        per_token={k: None if v is None else v.reshape(-1)[kept] for k, v in per_token.items()},
        settings=settings,
        chunk_size=chunk_size,
        compiled=compiled,
    )
    positions = hidden.reshape(-1, width).index_select(0, kept)
    loss, found = _FusedHeadLoss.apply(positions, plan, *(p for _, p in named))
    logprobs = found.new_zeros(batch * length)  # 0 where the loss does not read
    if not unread:
        logprobs.index_copy_(0, kept, found)
    return logprobs.view(batch, length), loss


def learner_loss(
    impl: str,
    model: Any,
    batch: Any,
    old_logprobs: torch.Tensor | None,
    settings: dict[str, Any],
    chunk_size: int,
    temperature: float,
    compiled: bool,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's loss as `impl` ("fused", "chunked" or "full") computes it, for the
    learner; `settings` are `policy_loss`'s keywords; `share_prefix` as for `token_logprobs`
    (the "full" path holds whole logits and never shares)."""
    if impl == "fused":
        return fused_policy_loss(
            model,
            batch.input_ids,
            batch.attention_mask,
            old_logprobs,
            chunk_size=chunk_size,
            temperature=temperature,
            compiled=compiled,
            share_prefix=share_prefix,
            **settings,
        )
    if impl == "chunked":
        args = (batch.input_ids, batch.attention_mask, chunk_size, temperature)
        logprobs = token_logprobs(model, *args, compiled=compiled, share_prefix=share_prefix)
    elif impl == "full":
        logprobs = full_logprobs(model, batch.input_ids, batch.attention_mask, temperature)
    else:
        raise ValueError(f"unknown loss_impl {impl!r}")
    old = logprobs.detach() if old_logprobs is None else old_logprobs
    return policy_loss(logprobs, old, **settings)
