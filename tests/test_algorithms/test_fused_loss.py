"""The fused, chunked policy loss (`toolgym.algorithms.fused_loss`) against the reference path
(the model's whole logits, then `policy_loss`): the same loss, the same gradient for every
parameter, in float64, for every loss type and setting, and through `torch.compile`."""

from __future__ import annotations

import warnings
from itertools import product

import pytest
import torch
from accelerate import Accelerator

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.algorithms import GRPOConfig, StepNormalizer, policy_loss
from toolgym.algorithms.fused_loss import fused_policy_loss, resolve_loss_impl
from toolgym.algorithms.learner import Learner
from toolgym.algorithms.losses import full_logprobs
from toolgym.testing import tiny_family_model, tiny_model, tiny_tokenizer

LOSS_TYPES = ["grpo", "dapo", "dr_grpo", "bnpo"]
# The float64 tolerance: the paths add the same terms in another order (measured: at most
# 2e-16 on losses, 1.1e-15 on gradients of size 0.01-1, over every loss type and family).
RTOL, ATOL = 1e-10, 1e-13


MODELS = {
    "llama": lambda: tiny_model(tiny_tokenizer(), seed=3),
    "gemma2-softcap": lambda: tiny_family_model("Gemma2Config", final_logit_softcapping=0.5),
    "cohere-logit_scale": lambda: tiny_family_model("CohereConfig", logit_scale=3.0),
    "granite-logits_scaling": lambda: tiny_family_model("GraniteConfig", logits_scaling=0.25),
}


def _inputs(model, generator: torch.Generator) -> dict:
    """A right-padded batch with observation gaps in the mask, per-token advantages (what
    `step_rewards="tokens"` gives), and old, reference and engine logprobs away from the
    model's own (ratio != 1, clipping, KL and importance weights all acting)."""
    vocab = model.config.vocab_size
    batch, length = 3, 23
    input_ids = torch.randint(0, vocab, (batch, length), generator=generator)
    attention = torch.ones(batch, length, dtype=torch.long)
    attention[2, 16:] = 0  # padding
    mask = torch.ones(batch, length - 1, dtype=torch.float64)
    mask[:, :4] = 0  # prompt
    mask[0, 9:13] = mask[1, 6:8] = 0  # tool results
    mask = mask * attention[:, 1:]
    with torch.no_grad():
        own = full_logprobs(model, input_ids, attention)

    def near() -> torch.Tensor:
        return own + 0.4 * torch.randn(own.shape, generator=generator, dtype=torch.float64)

    advantages = torch.randn(batch, 1, generator=generator, dtype=torch.float64)
    step_credit = 0.5 * torch.randn(batch, length - 1, generator=generator, dtype=torch.float64)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "mask": mask,
        "advantages": advantages + step_credit,
        "old": near(),
        "ref_logprobs": near(),
        "sampling_logprobs": near(),
        "episode_tokens": torch.tensor([17.0, 30.0, 9.0], dtype=torch.float64),
    }


def _loss_and_grads(model, data: dict, fused: bool, old: bool, **settings):
    normalizer = StepNormalizer(sequences=5, tokens=40.0, micro_batches=2, max_tokens=30)
    keywords = {k: data[k] for k in ("ref_logprobs", "sampling_logprobs", "episode_tokens")}
    keywords |= settings
    ids, attention = data["input_ids"], data["attention_mask"]
    model.zero_grad(set_to_none=True)
    if fused:
        old_logprobs = data["old"] if old else None
        loss, stats = fused_policy_loss(
            model, ids, attention, old_logprobs, data["advantages"], data["mask"], normalizer,
            chunk_size=7, **keywords,
        )  # fmt: skip
    else:
        logprobs = full_logprobs(model, ids, attention)
        old_logprobs = data["old"] if old else logprobs.detach()
        loss, stats = policy_loss(
            logprobs, old_logprobs, data["advantages"], data["mask"], normalizer, **keywords
        )
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), stats, grads


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_fused_loss_and_gradients_equal_the_full_logits_path_in_float64(family, loss_type):
    model = MODELS[family]().double().train()
    data = _inputs(model, torch.Generator().manual_seed(LOSS_TYPES.index(loss_type)))
    # old: several passes (ratio != 1) or one (ratio 1); KL on or off; IS correction on or off
    for old, beta, cap in product((True, False), (0.0, 0.1), (2.0, None)):
        settings = dict(loss_type=loss_type, clip_low=0.2, clip_high=0.28, beta=beta)
        settings["importance_cap"] = cap
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to full logits: the transform is known
            loss, stats, grads = _loss_and_grads(model, data, True, old, **settings)
        ref_loss, ref_stats, ref_grads = _loss_and_grads(model, data, False, old, **settings)
        assert torch.allclose(loss, ref_loss, rtol=RTOL, atol=ATOL), (old, beta, cap)
        assert stats.keys() == ref_stats.keys()
        assert all(stats[k] == pytest.approx(ref_stats[k], rel=1e-12) for k in stats)
        assert grads.keys() == ref_grads.keys() and len(grads) > 3
        for name, grad in grads.items():
            assert torch.allclose(grad, ref_grads[name], rtol=RTOL, atol=ATOL), (name, old)
        if old:  # the test's settings make the clip act and the ratio move
            assert ref_stats["clip_fraction"] > 0


def test_a_head_that_does_not_train_gets_no_gradient_and_the_rest_still_matches():
    model = MODELS["gemma2-softcap"]().double().train()
    model.get_input_embeddings().weight.requires_grad_(False)  # tied: the head is frozen too
    data = _inputs(model, torch.Generator().manual_seed(7))
    settings = dict(loss_type="dapo", beta=0.1, importance_cap=2.0)
    _, _, grads = _loss_and_grads(model, data, True, True, **settings)
    _, _, ref_grads = _loss_and_grads(model, data, False, True, **settings)
    assert "model.embed_tokens.weight" not in grads and grads.keys() == ref_grads.keys()
    assert all(torch.allclose(grads[n], ref_grads[n], rtol=RTOL, atol=ATOL) for n in grads)


def test_a_hooked_head_takes_autograd_through_the_module_and_matches():
    """A head that is not a bare `nn.Linear` (here one with a forward hook, as LoRA wrappers
    or offloading add) gets its gradients through the module by autograd instead of by hand."""
    model = MODELS["cohere-logit_scale"]().double().train()
    calls = []
    model.get_output_embeddings().register_forward_hook(lambda *_: calls.append(1))
    data = _inputs(model, torch.Generator().manual_seed(8))
    settings = dict(loss_type="grpo", beta=0.1, importance_cap=2.0)
    loss, _, grads = _loss_and_grads(model, data, True, True, **settings)
    used = len(calls)
    ref_loss, _, ref_grads = _loss_and_grads(model, data, False, True, **settings)
    chunks = -(-int((data["mask"] != 0).sum()) // 7)  # the positions the loss reads, by 7
    assert used >= chunks  # one call per chunk (besides the one-time check): the module ran
    assert torch.allclose(loss, ref_loss, rtol=RTOL, atol=ATOL)
    assert all(torch.allclose(grads[n], ref_grads[n], rtol=RTOL, atol=ATOL) for n in grads)


def test_bad_settings_are_named():
    model = MODELS["llama"]()
    data = _inputs(model.double(), torch.Generator().manual_seed(0))
    normalizer = StepNormalizer(sequences=1, tokens=1.0, micro_batches=1, max_tokens=1)
    args = (data["input_ids"], data["attention_mask"], None, data["advantages"], data["mask"])
    with pytest.raises(ValueError, match="beta > 0 needs the reference"):
        fused_policy_loss(model, *args, normalizer, beta=0.1)
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        fused_policy_loss(model, *args, normalizer, chunk_size=0)
    with pytest.raises(ValueError, match="unknown loss_impl 'liger'"):
        resolve_loss_impl("liger")
    with pytest.raises(ValueError, match="unknown loss_impl"):
        GRPOConfig(loss_impl="liger")  # type: ignore[arg-type]
    assert resolve_loss_impl("auto") == "fused"


@pytest.mark.slow
def test_compiled_fused_chunks_run_on_the_cpu_and_match_the_eager_ones():
    """The CUDA default (`compile_logprobs`) through torch.compile on this CPU: the loss and
    the gradients equal the eager fused path, for two lengths (a full and a ragged last
    chunk), with the soft-cap, the KL and the importance weights."""
    model = MODELS["gemma2-softcap"]().train()
    generator = torch.Generator().manual_seed(5)
    normalizer = StepNormalizer(sequences=2, tokens=30.0, micro_batches=1, max_tokens=40)
    for length in (17, 29):
        ids = torch.randint(0, 64, (2, length), generator=generator)
        attention = torch.ones_like(ids)
        mask = torch.ones(2, length - 1)
        advantages = torch.randn(2, generator=generator)
        with torch.no_grad():
            own = full_logprobs(model, ids, attention)
        settings = dict(
            loss_type="grpo",
            beta=0.1,
            ref_logprobs=own + 0.3,
            sampling_logprobs=own - 0.2,
            importance_cap=2.0,
            chunk_size=8,
        )
        results = []
        for compiled in (False, True):
            model.zero_grad(set_to_none=True)
            loss, _ = fused_policy_loss(
                model, ids, attention, own - 0.1, advantages, mask, normalizer,
                compiled=compiled, **settings,
            )  # fmt: skip
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        (eager, eager_grads), (fused, fused_grads) = results
        assert torch.allclose(eager, fused, atol=1e-6)
        pairs = zip(eager_grads, fused_grads, strict=True)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in pairs)


def _trajectories(tokenizer) -> list[Trajectory]:
    trajectories = []
    for i, turns in enumerate([(5, 3, 6), (9,), (4, 2, 4, 2, 3)]):
        sample = Sample(list(range(10 + i, 17 + i)))
        for j, n in enumerate(turns):
            ids = [(20 + 7 * i + 3 * j + k) % 100 for k in range(n)]
            sample.append(ids, sampled=j % 2 == 0, logprobs=[-1.5 - 0.1 * k for k in range(n)])
        end = len(sample.completion_ids) // 2
        trajectories.append(Trajectory([sample], step_rewards=[{"end": end, "reward": 0.3 * i}]))
    return trajectories


def test_the_learner_takes_the_same_step_with_every_loss_impl():
    """`Learner.update` with several passes, the KL, importance weights and per-token step
    rewards: the fused, chunked and full paths leave the same weights."""
    tokenizer = tiny_tokenizer()
    weights = {}
    for impl in ("fused", "chunked", "full"):
        config = GRPOConfig(
            output_dir="unused",
            loss_impl=impl,
            num_iterations=2,
            beta=0.1,
            step_rewards="tokens",
            micro_batch_size=2,
            learning_rate=1e-3,
            logprob_chunk_size=5,
            progress_bar=False,
        )
        model = tiny_model(tokenizer, seed=4).double()
        learner = Learner(model, config, Accelerator(cpu=True), tokenizer.pad_token_id)
        advantages = torch.tensor([0.8, -0.5, -0.3])
        stats = learner.update(
            _trajectories(tokenizer), advantages, torch.ones(3, dtype=torch.bool), 3
        )
        assert stats["kl"] > 0 and "clip_fraction/pass2" in stats
        weights[impl] = [p.detach().clone() for p in learner.policy.parameters()]
    for impl in ("chunked", "full"):
        pairs = zip(weights["fused"], weights[impl], strict=True)
        assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in pairs), impl
