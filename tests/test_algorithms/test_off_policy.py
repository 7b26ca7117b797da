"""Off-policy corrections as the field runs them (issue 44 item 4): importance weights per token
or per sequence, truncated or masked; GSPO's sequence ratio; CISPO; DeepSeek-V3.2's off-policy
sequence mask (OPSM); the engine/trainer mismatch figures.

Each is checked in float64, loss and gradient, against a direct implementation of its paper's
formula written here with Python loops over rows and tokens, and against TRL 1.16's own
`GRPOTrainer._compute_loss` (run on a stand-in trainer that hands it the logprobs). TRL
computes its engine importance weight inside its generation method, not in `_compute_loss`:
that weight is checked against its formula here and handed to TRL's loss.
"""

from __future__ import annotations

import math
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from toolgym.algorithms import GRPOConfig, StepNormalizer, policy_loss
from toolgym.algorithms.fused_loss import fused_policy_loss, learner_loss, resolve_loss_impl
from toolgym.algorithms.losses import LossSettings, importance_weight
from toolgym.testing import tiny_model, tiny_tokenizer

BENCH = Path(__file__).resolve().parents[2] / "bench"
B, T = 4, 6


def _batch(seed: int = 0):
    """Logprobs (a leaf with grad), old and engine logprobs, advantages and a ragged mask, in
    float64; the ratios and mismatches are large enough that every clip and mask acts."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1
    logprobs = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    sampling = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return logprobs, old, sampling, advantages, mask


def _reference():
    """The reference model's logprobs of the same tokens (for the KL term)."""
    g = torch.Generator().manual_seed(99)
    return -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1


def _normalizer(mask, max_tokens=T):
    return StepNormalizer(
        sequences=mask.shape[0], tokens=float(mask.sum()), micro_batches=1, max_tokens=max_tokens
    )


def _ours(settings: dict, seed: int = 0):
    logprobs, old, sampling, advantages, mask = _batch(seed)
    if settings.get("beta"):
        settings = settings | dict(ref_logprobs=_reference())
    loss, stats = policy_loss(
        logprobs, old, advantages, mask, _normalizer(mask), sampling_logprobs=sampling, **settings
    )
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad, stats


def _rows(mask):
    return [[t for t in range(T) if mask[i, t] > 0] for i in range(B)]


# -- direct implementations of each paper's formula --------------------------------------------
def _weights(old, sampling, mask, mode, low, high):
    """w[i][t]: exp(old - engine) per token, or exp(sum over the row) per sequence; clamped to
    [low, high] (truncated IS) or 0 outside it (masked IS)."""
    out = []
    for i, tokens in enumerate(_rows(mask)):
        if mode.startswith("sequence"):
            value = math.exp(sum(float(old[i, t] - sampling[i, t]) for t in tokens))
            row = {t: value for t in tokens}
        else:
            row = {t: math.exp(float(old[i, t] - sampling[i, t])) for t in tokens}
        for t, w in row.items():
            inside = (low is None or w >= low) and (high is None or w <= high)
            if mode.endswith("truncate"):
                row[t] = min(max(w, low if low is not None else -math.inf), high or math.inf)
            else:
                row[t] = w if inside else 0.0
        out.append(row)
    return out


def _direct(kind: str, mode=None, low=None, high=None, threshold=None, eps=(0.2, 0.28), cap=5.0):
    """The loss by the papers' formulas, token by token, and its gradient."""
    logprobs, old, sampling, advantages, mask = _batch()
    rows = _rows(mask)
    weights = _weights(old, sampling, mask, mode, low, high) if mode else None
    total_tokens = sum(len(r) for r in rows)
    loss = torch.zeros((), dtype=torch.float64)
    for i, tokens in enumerate(rows):
        a = float(advantages[i])
        keep = 1.0
        if threshold is not None:  # DeepSeek-V3.2 eq. 9: drop negative-advantage, far-off rows
            gap = sum(float(sampling[i, t] - logprobs[i, t].detach()) for t in tokens) / len(tokens)
            keep = 0.0 if (a < 0 and gap > threshold) else 1.0
        if kind == "gspo":  # GSPO: s_i = exp(mean log-ratio); loss = -mean_i min(s A, clip(s) A)
            s = torch.exp(sum(logprobs[i, t] - old[i, t] for t in tokens) / len(tokens))
            term = -torch.min(s * a, torch.clamp(s, 1 - eps[0], 1 + eps[1]) * a) * keep
            w = weights[i][tokens[0]] if weights else 1.0  # one weight per row (sequence modes)
            loss = loss + term * w / B
            continue
        for t in tokens:
            r = torch.exp(logprobs[i, t] - old[i, t])
            if kind == "cispo":  # MiniMax-M1 / ScaleRL: -sg(min(r, eps_max)) A log pi
                term = -torch.clamp(r, max=cap).detach() * a * logprobs[i, t]
            else:  # PPO's clipped term, token level (DAPO aggregation)
                term = -torch.min(r * a, torch.clamp(r, 1 - eps[0], 1 + eps[1]) * a)
            w = weights[i][t] if weights else 1.0
            loss = loss + term * keep * w / total_tokens
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad


CASES = {
    "token_truncate": (
        dict(importance_cap=2.0, importance_floor=0.6),
        ("ppo", "token_truncate", 0.6, 2.0),
    ),
    "token_mask": (
        dict(importance_cap=2.0, importance_floor=0.6, importance_mode="token_mask"),
        ("ppo", "token_mask", 0.6, 2.0),
    ),
    "sequence_truncate": (
        dict(importance_cap=3.0, importance_mode="sequence_truncate"),
        ("ppo", "sequence_truncate", None, 3.0),
    ),
    "sequence_mask": (
        dict(importance_cap=3.0, importance_mode="sequence_mask"),
        ("ppo", "sequence_mask", None, 3.0),
    ),
    "gspo": (dict(ratio_level="sequence", loss_type="grpo"), ("gspo", None, None, None)),
    "gspo + sequence_mask": (
        dict(
            ratio_level="sequence",
            loss_type="grpo",
            importance_cap=3.0,
            importance_mode="sequence_mask",
        ),
        ("gspo", "sequence_mask", None, 3.0),
    ),
    "cispo": (dict(loss_type="cispo", cispo_cap=1.1), ("cispo", None, None, None)),
    "cispo + token_mask": (
        dict(loss_type="cispo", cispo_cap=1.1, importance_cap=2.0, importance_mode="token_mask"),
        ("cispo", "token_mask", None, 2.0),
    ),
    "opsm": (dict(off_policy_threshold=0.1), ("ppo", None, None, None)),
    "opsm + token_truncate": (
        dict(off_policy_threshold=0.1, importance_cap=2.0),
        ("ppo", "token_truncate", None, 2.0),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_correction_matches_its_paper_s_formula_in_float64(name):
    settings, (kind, mode, low, high) = CASES[name]
    settings = dict(clip_low=0.2, clip_high=0.28) | settings
    threshold = settings.get("off_policy_threshold")
    loss, grad, _ = _ours(settings)
    expected_loss, expected_grad = _direct(
        kind, mode, low, high, threshold, cap=settings.get("cispo_cap", 5.0)
    )
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-14)


def test_the_corrections_act_on_this_batch():
    """The cases above would prove little if no clip, mask or drop acted on the batch."""
    _, old, sampling, _, mask = _batch()
    truncated = importance_weight(
        old, sampling, LossSettings(importance_cap=2.0, importance_floor=0.6)
    )
    assert ((truncated == 2.0) & (mask > 0)).any() and ((truncated == 0.6) & (mask > 0)).any()
    masked = importance_weight(
        old, sampling, LossSettings(importance_cap=3.0, importance_mode="sequence_mask"), mask
    )
    assert masked.shape == (B, 1) and (masked == 0).any() and (masked > 0).any()
    *_, opsm = _ours(dict(off_policy_threshold=0.1))
    assert 0 < opsm["off_policy_masked"] < 1
    *_, cispo = _ours(dict(loss_type="cispo", cispo_cap=1.1))
    assert 0 < cispo["clip_fraction"] < 1
    *_, plain = _ours({})
    gspo_loss, *_ = _ours(dict(ratio_level="sequence", loss_type="grpo"))
    token_loss, *_ = _ours(dict(loss_type="grpo"))
    assert gspo_loss != token_loss and 0 < plain["clip_fraction"] < 1


def test_the_mismatch_figures_are_the_k3_kl_over_scored_tokens():
    _, old, sampling, _, mask = _batch()
    sampling = sampling.clone()
    sampling[0, 0] = float("nan")  # a token the engine gave no logprob for
    logprobs = old.clone().requires_grad_()
    _, stats = policy_loss(
        logprobs, old, torch.ones(B, dtype=torch.float64), mask, _normalizer(mask),
        sampling_logprobs=sampling,
    )  # fmt: skip
    scored = [(i, t) for i, row in enumerate(_rows(mask)) for t in row if (i, t) != (0, 0)]
    gaps = [float(old[i, t] - sampling[i, t]) for i, t in scored]
    assert stats["mismatch_kl"] == pytest.approx(sum(math.exp(d) - d - 1 for d in gaps) / len(gaps))
    assert stats["mismatch_abs"] == pytest.approx(sum(abs(d) for d in gaps) / len(gaps))
    assert "is_weight" not in stats  # logged with no correction on


# -- TRL 1.16's own loss --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trl_compute_loss():
    sys.path.insert(0, str(BENCH))
    try:
        from trl_peer import import_trl

        import_trl()
        from trl import GRPOTrainer
    finally:
        sys.path.remove(str(BENCH))
    return GRPOTrainer._compute_loss, GRPOTrainer.get_off_policy_mask


def _trl_loss(trl_compute_loss, trl_settings: dict, weight):
    """TRL's `_compute_loss` on the same batch, with a stand-in trainer whose model hands it
    the logprobs."""
    compute_loss, off_policy_mask = trl_compute_loss
    logprobs, old, sampling, advantages, mask = _batch()
    accelerator = types.SimpleNamespace(
        num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x
    )
    trainer = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (
            logprobs,
            torch.zeros_like(logprobs),
            None,
        ),
        top_entropy_quantile=1.0,
        get_off_policy_mask=off_policy_mask,
        importance_sampling_level=trl_settings.get("importance_sampling_level", "token"),
        off_policy_mask_threshold=trl_settings.get("off_policy_mask_threshold"),
        beta=trl_settings.get("beta", 0.0),
        loss_type=trl_settings.get("loss_type", "dapo"),
        epsilon_low=0.2,
        epsilon_high=trl_settings.get("epsilon_high", 0.28),
        args=types.SimpleNamespace(
            delta=None,
            use_bias_correction_kl=trl_settings.get("use_bias_correction_kl", True),
            steps_per_generation=1,
        ),
        use_vllm=weight is not None,
        vllm_importance_sampling_correction=weight is not None,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=accelerator,
        max_completion_length=T,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    inputs = {
        "prompt_ids": torch.ones(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.ones(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "sampling_per_token_logps": sampling,
        "num_items_in_batch": mask.sum(),
        "ref_per_token_logps": _reference(),
    }
    if weight is not None:
        inputs["importance_sampling_ratio"] = weight
    loss = compute_loss(trainer, None, inputs)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad


TRL_CASES = {
    # name: (toolgym's keywords, TRL's settings, TRL's vllm_importance_sampling_mode or None)
    "dapo, token_truncate": (dict(importance_cap=3.0), {}, "token_truncate"),
    "dapo, token_mask": (dict(importance_cap=3.0, importance_mode="token_mask"), {}, "token_mask"),
    "dapo, sequence_mask (TRL's default)": (
        dict(importance_cap=3.0, importance_mode="sequence_mask"),
        {},
        "sequence_mask",
    ),
    "dapo, sequence_truncate": (
        dict(importance_cap=3.0, importance_mode="sequence_truncate"),
        {},
        "sequence_truncate",
    ),
    "grpo, sequence ratio (GSPO)": (
        dict(loss_type="grpo", ratio_level="sequence"),
        dict(loss_type="grpo", importance_sampling_level="sequence"),
        None,
    ),
    "bnpo": (dict(loss_type="bnpo"), dict(loss_type="bnpo"), None),
    "dr_grpo": (dict(loss_type="dr_grpo"), dict(loss_type="dr_grpo"), None),
    "cispo": (
        dict(loss_type="cispo", cispo_cap=1.1),
        dict(loss_type="cispo", epsilon_high=1.1),
        None,
    ),
    "cispo, sequence ratio": (
        dict(loss_type="cispo", cispo_cap=1.1, ratio_level="sequence"),
        dict(loss_type="cispo", epsilon_high=1.1, importance_sampling_level="sequence"),
        None,
    ),
    "dapo, KL with bias correction (TRL's default)": (
        dict(beta=0.1, kl_bias_correction=True),
        dict(beta=0.1),
        None,
    ),
    "dapo, KL without": (dict(beta=0.1), dict(beta=0.1, use_bias_correction_kl=False), None),
    "grpo, sequence ratio, KL with bias correction": (
        dict(loss_type="grpo", ratio_level="sequence", beta=0.1, kl_bias_correction=True),
        dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.1),
        None,
    ),
    "opsm": (dict(off_policy_threshold=0.1), dict(off_policy_mask_threshold=0.1), None),
    "opsm, sequence_mask": (
        dict(off_policy_threshold=0.1, importance_cap=3.0, importance_mode="sequence_mask"),
        dict(off_policy_mask_threshold=0.1),
        "sequence_mask",
    ),
}


@pytest.mark.parametrize("name", list(TRL_CASES))
def test_each_loss_matches_trl_1_16_s_compute_loss(trl_compute_loss, name):
    ours_settings, trl_settings, trl_mode = TRL_CASES[name]
    settings = dict(clip_low=0.2, clip_high=0.28) | ours_settings
    loss, grad, _ = _ours(settings)
    weight = None
    if trl_mode is not None:
        _, old, sampling, _, mask = _batch()
        mode = ours_settings.get("importance_mode", "token_truncate")
        weight = importance_weight(
            old, sampling, LossSettings(importance_cap=3.0, importance_mode=mode), mask
        )
        assert mode == trl_mode
    trl_loss, trl_grad = _trl_loss(trl_compute_loss, trl_settings, weight)
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-10, atol=1e-14)


# -- the settings, and the paths that compute the loss --------------------------------------------
def test_settings_that_need_whole_rows_take_the_chunked_path_and_fused_refuses_them():
    assert resolve_loss_impl("auto") == "fused"
    for whole in (
        dict(importance_sampling_level="sequence"),
        dict(importance_sampling_mode="sequence_mask"),
        dict(off_policy_mask_threshold=0.5),
    ):
        config = GRPOConfig(**whole)
        assert config.loss_settings().whole_sequences
        assert resolve_loss_impl(config.loss_impl, True) == "chunked"
        with pytest.raises(ValueError, match="needs each row's whole logprobs"):
            GRPOConfig(loss_impl="fused", **whole)
    # a sequence mode with the correction off needs nothing of the kind
    assert (
        not GRPOConfig(importance_sampling=False, importance_sampling_mode="sequence_mask")
        .loss_settings()
        .whole_sequences
    )
    for bad, message in (
        (dict(loss_type="gspo"), "unknown loss_type 'gspo'"),
        (dict(importance_sampling_mode="sequence"), "unknown importance_mode"),
        (dict(importance_sampling_level="row"), "unknown ratio_level"),
        (dict(cispo_cap=0.0), "cispo_cap must be positive"),
    ):
        with pytest.raises(ValueError, match=message):
            GRPOConfig(**bad)


def test_fused_chunked_and_full_paths_agree_on_token_level_corrections(monkeypatch):
    """CISPO and masked token weights, fused per chunk, give the loss and gradients of whole
    logprobs; OPSM and sequence weights through `learner_loss` take the chunked path."""
    torch.manual_seed(0)
    model = tiny_model(tiny_tokenizer()).double()
    ids = torch.randint(0, model.config.vocab_size, (3, 9))
    attention = torch.ones_like(ids)
    mask = torch.ones(3, 8, dtype=torch.float64)
    mask[:, :2] = 0
    with torch.no_grad():
        from toolgym.algorithms.losses import full_logprobs

        base = full_logprobs(model, ids, attention, 1.0)
    old = base + 0.3 * torch.randn_like(base)
    sampling = base + 0.5 * torch.randn_like(base)
    advantages = torch.tensor([1.0, -0.6, 0.4], dtype=torch.float64)
    normalizer = StepNormalizer(
        sequences=3, tokens=float(mask.sum()), micro_batches=1, max_tokens=8
    )
    settings = dict(
        advantages=advantages, mask=mask, normalizer=normalizer, loss_type="cispo",
        clip_low=0.2, clip_high=0.28, sampling_logprobs=sampling, importance_cap=1.5,
        importance_floor=0.7, importance_mode="token_mask", cispo_cap=1.2,
    )  # fmt: skip
    from toolgym.algorithms import fused_loss

    fused_calls = []
    real_fused = fused_loss._fused
    monkeypatch.setattr(fused_loss, "_fused", lambda *a: fused_calls.append(1) or real_fused(*a))
    results = {}
    for impl in ("fused", "full"):
        model.zero_grad()
        batch = types.SimpleNamespace(input_ids=ids, attention_mask=attention)
        loss, stats = learner_loss(impl, model, batch, old, settings, 4, 1.0, False)
        loss.backward()
        results[impl] = (loss.item(), [p.grad.clone() for p in model.parameters()], stats)
    assert fused_calls == [1]  # the fused path ran (no fallback to whole logits)
    assert results["fused"][0] == pytest.approx(results["full"][0], rel=1e-9)
    for fused, full in zip(results["fused"][1], results["full"][1], strict=True):
        torch.testing.assert_close(fused, full, rtol=1e-7, atol=1e-10)
    assert results["fused"][2]["is_masked"] == pytest.approx(results["full"][2]["is_masked"])
    assert 0 < results["full"][2]["is_masked"] < 1
    with pytest.raises(ValueError, match="whole logprobs"):
        fused_policy_loss(
            model, ids, attention, old, advantages, mask, normalizer, ratio_level="sequence"
        )
