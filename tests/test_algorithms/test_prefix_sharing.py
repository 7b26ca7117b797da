"""A micro-batch's common prefix computed once gives the plain pass's loss and gradients."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import float64_norms

from toolgym.algorithms import prefix_sharing
from toolgym.algorithms.fused_loss import fused_policy_loss, learner_loss
from toolgym.algorithms.losses import StepNormalizer, captured_hidden
from toolgym.algorithms.prefix_sharing import shared_prefix_length
from toolgym.testing import tiny_family_model

FAMILIES = ["LlamaConfig", "Qwen2Config", "Qwen3Config"]


def _batch(prefix: int = 14) -> tuple[torch.Tensor, torch.Tensor]:
    """Three right-padded rows sharing their first `prefix` tokens."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(64, (3, 30), generator=generator)
    ids[1:, :prefix] = ids[0, :prefix]
    mask = torch.ones_like(ids)
    mask[2, -6:] = 0
    return ids, mask


class _Batch:
    def __init__(self, ids: torch.Tensor, mask: torch.Tensor):
        self.input_ids, self.attention_mask = ids, mask


def _loss_and_grads(model, ids, mask, impl: str, share: bool, old=None):
    generator = torch.Generator().manual_seed(2)
    loss_mask = mask[:, 1:].double() * (torch.rand(mask[:, 1:].shape, generator=generator) > 0.3)
    settings = dict(
        advantages=torch.randn(mask[:, 1:].shape, generator=generator, dtype=torch.float64),
        mask=loss_mask,
        normalizer=StepNormalizer(sequences=3, tokens=float(loss_mask.sum()), micro_batches=1,
                                  max_tokens=30),
        loss_type="dapo",
        clip_low=0.2,
        clip_high=0.28,
        beta=0.04,
        ref_logprobs=torch.randn(mask[:, 1:].shape, generator=generator, dtype=torch.float64) - 4,
        sampling_logprobs=None,
        importance_cap=None,
        episode_tokens=None,
    )  # fmt: skip
    model.zero_grad()
    loss, _ = learner_loss(impl, model, _Batch(ids, mask), old, settings, 7, 0.9, False, share)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("impl", ["fused", "chunked"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prefix_gives_the_plain_loss_and_gradients(family, impl, checkpointing):
    model = tiny_family_model(family).double().train()
    float64_norms(model)
    if checkpointing:
        model.gradient_checkpointing_enable()
    ids, mask = _batch()
    for old in (None, torch.randn(3, 29, dtype=torch.float64) - 4):  # one pass, later passes
        plain = _loss_and_grads(model, ids, mask, impl, share=False, old=old)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the model shares: no fallback warning
            shared = _loss_and_grads(model, ids, mask, impl, share=True, old=old)
        assert torch.allclose(shared[0], plain[0], rtol=1e-12, atol=0)
        for name, grad in plain[1].items():
            scale = float(grad.abs().max())  # measured: within 1.3e-15 of it
            assert torch.allclose(shared[1][name], grad, rtol=1e-12, atol=1e-12 * scale), name


def test_float32_norms_bound_the_comparison_as_they_bound_regrouping():
    """Unpatched (norms in float32): sharing differs from the plain pass no more than the plain
    pass differs from itself when the same rows are summed in another grouping."""
    model = tiny_family_model("LlamaConfig").double().train()
    ids, mask = _batch()
    weights = torch.randn(
        3, 30, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )

    def grads(loss_of) -> dict[str, torch.Tensor]:
        model.zero_grad()
        loss_of().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    def hidden(i, m, share):
        return captured_hidden(model, i, m, share)[1]

    plain = grads(lambda: (hidden(ids, mask, False) * weights)[:, :14].sum())
    shared = grads(lambda: (hidden(ids, mask, True) * weights)[:, :14].sum())
    first = (ids[:1, :14], mask[:1, :14])  # the same rows' prefix, summed before the model
    regrouped = grads(lambda: (hidden(*first, False) * weights[:, :14].sum(0)).sum())

    def gap(a, b):
        return max(float((a[n] - b[n]).abs().max()) for n in a)

    assert gap(shared, plain) <= 2 * gap(regrouped, plain) + 1e-12
    assert gap(shared, plain) < 1e-6 * max(float(g.abs().max()) for g in plain.values())


def test_the_common_prefix_stops_short_of_every_rows_last_token():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 4, 0], [1, 2, 3, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert shared_prefix_length(ids, mask) == 3
    assert shared_prefix_length(ids[:2], mask[:2]) == 3  # row 2 keeps its last real token
    assert shared_prefix_length(ids[:1], mask[:1]) == 0  # one row: nothing to share


def test_sliding_window_models_run_the_plain_pass_with_one_warning():
    model = tiny_family_model("Gemma2Config").double().train()
    ids, mask = _batch()
    plain = _loss_and_grads(model, ids, mask, "fused", share=False)
    with pytest.warns(UserWarning, match="not plain full attention"):
        shared = _loss_and_grads(model, ids, mask, "fused", share=True)
    assert torch.equal(shared[0], plain[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the answer is kept: no second warning
        _loss_and_grads(model, ids, mask, "fused", share=True)


def test_padding_inside_the_common_tokens_is_never_shared():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])  # left padding in row 1
    assert shared_prefix_length(ids, mask) == 0


def test_models_with_dropout_run_the_plain_pass():
    model = tiny_family_model("LlamaConfig", attention_dropout=0.1).double().train()
    ids, mask = _batch()
    with pytest.warns(UserWarning, match="it has dropout"):
        captured_hidden(model, ids, mask, share_prefix=True)


def test_the_probe_catches_gradients_that_do_not_reach_the_prefix(monkeypatch):
    """A shared pass whose forward is right but whose keys and values are cut from the graph
    (what a model that detached its cache would do) fails the probe's gradient check."""
    original = prefix_sharing._PrefixLayer.__init__

    def detached(self, keys, values):
        original(self, keys.detach(), values.detach())

    monkeypatch.setattr(prefix_sharing._PrefixLayer, "__init__", detached)
    model = tiny_family_model("LlamaConfig").double().train()
    ids, mask = _batch()
    with pytest.warns(UserWarning, match="gradients differ from the plain pass"):
        captured_hidden(model, ids, mask, share_prefix=True)


def test_a_shared_pass_that_fails_in_training_falls_back_to_the_plain_pass(monkeypatch):
    model = tiny_family_model("LlamaConfig").double().train()
    ids, mask = _batch()
    plain = captured_hidden(model, ids, mask)[1]
    captured_hidden(model, ids, mask, share_prefix=True)  # the probe passes

    def broken(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("a cache this model does not understand")

    monkeypatch.setattr(prefix_sharing._PrefixLayer, "update", broken)
    with pytest.warns(UserWarning, match="the shared pass failed"):
        hidden = captured_hidden(model, ids, mask, share_prefix=True)[1]
    assert torch.equal(hidden, plain)


def test_a_micro_batch_that_enters_no_loss_has_zero_loss_and_gradients():
    model = tiny_family_model("LlamaConfig").double().train()
    ids, mask = _batch()
    normalizer = StepNormalizer(sequences=3, tokens=1.0, micro_batches=1, max_tokens=30)
    zeros = torch.zeros(3, 29, dtype=torch.float64)
    loss, _ = fused_policy_loss(model, ids, mask, None, zeros, zeros, normalizer)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_sharing_is_on_by_default_except_on_cuda():
    """`share_prefix=None`: on CPUs (where it measured faster), off on CUDA (where the rows'
    explicit mask measured slower than the plain pass's fused causal attention)."""
    from toolgym.algorithms.prefix_sharing import share_prefix_by_default

    assert share_prefix_by_default(None, torch.device("cpu")) is True
    assert share_prefix_by_default(None, torch.device("cuda")) is False
    assert share_prefix_by_default(True, torch.device("cuda")) is True
    assert share_prefix_by_default(False, torch.device("cpu")) is False
