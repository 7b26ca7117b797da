"""The loss, advantages and logprobs against direct hand computations on small tensors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import transformers

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.algorithms import (
    StepNormalizer,
    collate,
    group_advantages,
    policy_loss,
    token_logprobs,
    training_samples,
)
from toolgym.testing import tiny_family_model, tiny_model, tiny_tokenizer


def test_grpo_advantages_by_hand():
    advantages, used = group_advantages([1.0, 0.0, 0.0, 1.0], [True] * 4, 4, scale="none")
    assert advantages.tolist() == [0.5, -0.5, -0.5, 0.5] and used.all()
    scaled, _ = group_advantages([1.0, 0.0, 0.0, 1.0], [True] * 4, 4, scale="group")
    std = math.sqrt(sum((x - 0.5) ** 2 for x in [1, 0, 0, 1]) / 3)  # unbiased, like torch.std
    assert scaled.tolist() == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], 1e-3)


def test_rloo_baseline_is_the_mean_of_the_others():
    advantages, _ = group_advantages([3.0, 1.0, 2.0], [True] * 3, 3, baseline="rloo", scale="none")
    assert advantages.tolist() == pytest.approx([3 - 1.5, 1 - 2.5, 2 - 2.0])


def test_infrastructure_failures_leave_the_baseline_and_the_loss():
    rewards = [1.0, 0.0, 0.0, 5.0, 0.0, 1.0]  # groups of 3; the 5.0 is a crashed episode
    valid = [True, True, True, False, True, False]
    advantages, used = group_advantages(rewards, valid, 3, scale="none")
    assert advantages[:3].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    # the second group keeps one valid member: no baseline, no contribution
    assert used.tolist() == [True, True, True, False, False, False]
    assert advantages[3:].tolist() == [0.0, 0.0, 0.0]


def _loss(logprobs, old, advantages, mask, loss_type, **kwargs):
    tokens = float(mask.sum())
    normalizer = StepNormalizer(
        sequences=mask.shape[0], tokens=tokens, micro_batches=1, max_tokens=10
    )
    loss, _ = policy_loss(
        logprobs, old, advantages, mask, normalizer, loss_type=loss_type, **kwargs
    )
    return loss


def test_each_loss_type_matches_a_hand_computation():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]])
    old = torch.tensor([[-1.1, -1.5, -0.5], [-0.3, -1.0, -0.9]])
    advantages = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])

    def token(lp, lo, a, low=0.2, high=0.28):
        ratio = math.exp(lp - lo)
        return -min(ratio * a, min(max(ratio, 1 - low), 1 + high) * a)

    per_token = [
        [token(logprobs[i, j].item(), old[i, j].item(), advantages[i].item()) for j in range(3)]
        for i in range(2)
    ]
    row0 = per_token[0][0] + per_token[0][2]
    row1 = sum(per_token[1])
    expected = {
        "grpo": (row0 / 2 + row1 / 3) / 2,
        "bnpo": (row0 + row1) / 5,
        "dapo": (row0 + row1) / 5,
        "dr_grpo": (row0 + row1) / (2 * 10),
    }
    for loss_type, value in expected.items():
        loss = _loss(logprobs, old, advantages, mask, loss_type, clip_low=0.2, clip_high=0.28)
        assert loss.item() == pytest.approx(value, rel=1e-5), loss_type


def test_kl_and_importance_weights_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    sampling = torch.tensor([[-0.2, -2.0]])
    mask = torch.tensor([[1.0, 1.0]])
    advantages = torch.tensor([1.0])
    loss = _loss(
        logprobs,
        logprobs,
        advantages,
        mask,
        "dapo",
        beta=0.1,
        ref_logprobs=ref,
        sampling_logprobs=sampling,
        importance_cap=2.0,
    )
    weights = [min(math.exp(-1.0 - -0.2), 2.0), min(math.exp(-2.0 - -2.0), 2.0)]
    kl = [math.exp(d) - d - 1 for d in (-1.5 - -1.0, -1.0 - -2.0)]
    expected = sum(-1.0 * w + 0.1 * k for w, k in zip(weights, kl, strict=True)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_changing_an_observation_token_logit_changes_nothing():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0]])  # the middle token is a tool result
    args = (logprobs.detach(), torch.tensor([0.7]), mask, "dapo")
    loss = _loss(logprobs, *args)
    loss.backward()
    assert logprobs.grad[0, 1] == 0.0
    changed = logprobs.detach().clone()
    changed[0, 1] = -9.0
    assert _loss(changed, *args).item() == loss.item()


def test_chunked_logprobs_equal_full_logits_and_ignore_observation_tokens():
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=3)
    trajectory = Trajectory([Sample(list(range(5, 12)))])
    trajectory.append(list(range(20, 26)), sampled=True, logprobs=[-0.5] * 6)
    trajectory.append(list(range(40, 44)), sampled=False)
    trajectory.append(list(range(30, 33)), sampled=True, logprobs=[-0.5] * 3)
    batch = collate(training_samples([trajectory], advantages=[1.0]), tokenizer.pad_token_id)
    chunked = token_logprobs(model, batch.input_ids, batch.attention_mask, chunk_size=4)
    logits = model(input_ids=batch.input_ids).logits[:, :-1].float()
    direct = logits.log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(chunked, direct, atol=1e-5)
    mask, _, tokens = batch.targets()
    assert tokens == 9  # only sampled tokens: not the prompt, not the 4 observation tokens
    assert mask[0, 7 + 6 - 1 : 7 + 6 + 4 - 1].sum() == 0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_per_turn_samples_give_the_single_sequence_loss_where_both_apply(loss_type):
    """On a prefix-preserving template an episode can be trained as one sequence or as one
    sample per turn; both must give the same loss and the same gradient."""
    from helpers import GUESS, ids, wordle_rows

    import toolgym
    from toolgym.agents import Agent, ScriptedEngine

    tokenizer = tiny_tokenizer()
    replies = [GUESS.format(word=w) for w in ("slate", "moist", "crane")]

    def play(per_turn: bool) -> Trajectory:
        engine = ScriptedEngine([ids(tokenizer, r) for r in replies])
        agent = Agent(engine, tokenizer, parser="hermes", per_turn=per_turn)
        (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
        return trajectory

    whole, per_turn = play(False), play(True)
    sequence = whole.prompt_ids + whole.completion_ids
    assert len(per_turn.samples) == 3
    for sample in per_turn.samples:  # each turn's prompt is the sequence so far
        prefix = sample.prompt_ids + sample.completion_ids
        assert sequence[: len(prefix)] == prefix
    model = tiny_model(tokenizer, seed=5)

    def loss_and_grad(trajectory: Trajectory) -> tuple[float, torch.Tensor]:
        batch = collate(training_samples([trajectory], advantages=[0.7]), tokenizer.pad_token_id)
        mask, sampling, tokens = batch.targets()
        logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask)
        normalizer = StepNormalizer(
            sequences=1, tokens=float(tokens), micro_batches=1, max_tokens=512
        )
        loss, _ = policy_loss(
            logprobs,
            logprobs.detach(),
            batch.advantages,
            mask,
            normalizer,
            loss_type=loss_type,
            sampling_logprobs=sampling,
            importance_cap=2.0,
            episode_tokens=batch.episode_tokens,
        )
        model.zero_grad()
        loss.backward()
        grad = model.get_input_embeddings().weight.grad.clone()
        return loss.item(), grad

    whole_loss, whole_grad = loss_and_grad(whole)
    turn_loss, turn_grad = loss_and_grad(per_turn)
    assert turn_loss == pytest.approx(whole_loss, rel=1e-5)
    assert torch.allclose(turn_grad, whole_grad, atol=1e-6)


def _reference_logprobs(model, input_ids):
    logits = model(input_ids=input_ids).logits[:, :-1].float()
    return logits.log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize(
    ("family", "extra"),
    [
        ("Gemma2Config", {"final_logit_softcapping": 0.5}),  # tanh soft-cap after the head
        ("CohereConfig", {"logit_scale": 3.0}),  # multiplies the logits
        ("GraniteConfig", {"logits_scaling": 0.25}),  # divides the logits
    ],
)
def test_families_that_transform_logits_after_the_head_get_exact_chunked_logprobs(family, extra):
    model = tiny_family_model(family, **extra)
    input_ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to full logits: the transform is known
        chunked = token_logprobs(model, input_ids, torch.ones_like(input_ids), chunk_size=5)
    assert torch.allclose(chunked, _reference_logprobs(model, input_ids), atol=1e-5)


def test_an_unknown_logit_transform_falls_back_to_full_logits_with_a_warning():
    class Shifted(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 4.0 + torch.arange(out.logits.shape[-1]) * 0.1
            return out

    tokenizer = tiny_tokenizer()
    model = Shifted(tiny_model(tokenizer, seed=3).config).eval()
    input_ids = torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(2))
    with pytest.warns(UserWarning, match="Shifted: the output head applied chunk by chunk"):
        logprobs = token_logprobs(model, input_ids, torch.ones_like(input_ids), chunk_size=4)
    assert torch.allclose(logprobs, _reference_logprobs(model, input_ids), atol=1e-5)


@pytest.mark.slow
def test_compiled_chunks_give_the_eager_logprobs_and_gradients():
    """`compile_logprobs` (the CUDA default) through torch.compile on this CPU: the values and
    the gradients equal the eager path, for the first shape and for a later, different one."""
    model = tiny_model(tiny_tokenizer(), seed=3)
    for length in (17, 29):
        input_ids = torch.randint(0, 100, (2, length), generator=torch.Generator().manual_seed(4))
        mask = torch.ones_like(input_ids)
        results = []
        for compiled in (False, True):
            model.zero_grad()
            logprobs = token_logprobs(model, input_ids, mask, chunk_size=8, compiled=compiled)
            logprobs.sum().backward()
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            results.append((logprobs.detach(), grads))
        (eager, eager_grads), (fused, fused_grads) = results
        assert torch.allclose(eager, fused, atol=1e-5)
        pairs = zip(eager_grads, fused_grads, strict=True)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in pairs)
