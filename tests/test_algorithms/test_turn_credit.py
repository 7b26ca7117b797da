"""Turn-level credit (issue 44 item 3): per-turn advantages from reward-to-go with a baseline of
the group's other members, by hand in float64; unbiased for episodes whose length the policy
chooses (the exact expectation of the estimator equals the true gradient on a small game,
where a per-turn-index baseline is biased, verl #7244); and through the trainer on scripted
chat episodes whose tool calls earn step rewards."""

from __future__ import annotations

import itertools
import math

import pytest
from points_game import PLAN, ROW, Points, follow_the_plan, model_turns, play

import toolgym
from toolgym.agents import Agent, ScriptedEngine
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.batch import collate, training_samples
from toolgym.algorithms.environments import EveryRow
from toolgym.algorithms.sampler import Sampler
from toolgym.algorithms.turn_credit import (
    batch_credit,
    token_credit,
    turn_advantages,
    turn_rewards,
    turns,
)
from toolgym.testing import tiny_tokenizer


def test_turn_advantages_by_hand():
    """A group of three: rewards 1.0, 0.25, -1.0 with 3, 2 and 1 turns."""
    totals = [1.0, 0.25, -1.0]
    per_turn = [[0.5, 0.0, 0.5], [1.0, -0.75], [0.0]]
    got = turn_advantages(totals, per_turn, [True] * 3, 3, scale="none")
    # rewards to go: A (1.0, 0.5, 0.5); B (0.25, -0.75); C (-1.0)
    assert got[0] == pytest.approx([1.0 - (0.25 - 1.0) / 2, 0.5 - (-0.75), 0.5 - 0.0], abs=1e-15)
    assert got[1] == pytest.approx([0.25 - (1.0 - 1.0) / 2, -0.75 - 0.5], abs=1e-15)
    assert got[2] == pytest.approx([-1.0 - (1.0 + 0.25) / 2], abs=1e-15)
    # turn 1 is RLOO's episode advantage; group scaling divides by the rewards' sample std
    std = math.sqrt(sum((t - sum(totals) / 3) ** 2 for t in totals) / 2)
    scaled = turn_advantages(totals, per_turn, [True] * 3, 3, scale="group")
    assert scaled[1] == pytest.approx([a / (std + 1e-4) for a in got[1]], abs=1e-15)
    # an invalid member leaves the baselines; a group of one valid member trains nothing
    partial = turn_advantages(totals, per_turn, [True, False, True], 3, scale="none")
    assert partial[1] == [0.0, 0.0]
    assert partial[0] == pytest.approx([1.0 - -1.0, 0.5, 0.5], abs=1e-15)
    alone = turn_advantages(totals, per_turn, [True, False, False], 3, scale="none")
    assert alone[0] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="do not form groups of 2"):
        turn_advantages(totals, per_turn, [True] * 3, 2)
    with pytest.raises(ValueError, match="unknown scale"):
        turn_advantages(totals, per_turn, [True] * 3, 3, scale="rank")


# -- unbiased where the policy chooses when to stop ----------------------------------------------
# A game of at most two turns; at each the policy continues with probability p = sigmoid(theta)
# (score function d log pi / d theta: 1 - p for continue, -p for stop).
#   stop at turn 1:                   reward 0.5, no step rewards
#   continue (+1), stop at turn 2:    reward 1.0, step rewards [1, 0]
#   continue (+1), continue (-2):     reward -1.0, step rewards [1, -2] (the game ends)
GAMES = [
    (0.5, [0.0], ["stop"]),
    (1.0, [1.0, 0.0], ["go", "stop"]),
    (-1.0, [1.0, -2.0], ["go", "go"]),
]


def _probability(game, p):
    return math.prod(p if action == "go" else 1 - p for action in game[2])


def _score(action, p):
    return 1 - p if action == "go" else -p


def _expected_estimate(advantages_of, p, group=3):
    """E[(1/G) sum_i sum_t A[i, t] * score(a[i, t])], every group of `group` games enumerated."""
    total = 0.0
    for members in itertools.product(GAMES, repeat=group):
        chance = math.prod(_probability(g, p) for g in members)
        advantages = advantages_of([g[0] for g in members], [g[1] for g in members])
        estimate = sum(
            a * _score(action, p)
            for game, per_turn in zip(members, advantages, strict=True)
            for a, action in zip(per_turn, game[2], strict=True)
        )
        total += chance * estimate / group
    return total


def _per_turn_index_baseline(totals, per_turn):
    """The biased construction (MT-GRPO style): each turn index's rewards centred on the mean
    of the members that reached it (own included), summed over the turns the episode played;
    the final reward counts at the last turn."""
    rewards = [list(r) for r in per_turn]
    for r, total in zip(rewards, totals, strict=True):
        r[-1] += total - sum(r)
    longest = max(len(r) for r in rewards)
    means = [
        sum(r[k] for r in rewards if len(r) > k) / sum(1 for r in rewards if len(r) > k)
        for k in range(longest)
    ]
    return [
        [sum(r[k] - means[k] for k in range(t, len(r))) for t in range(len(r))] for r in rewards
    ]


@pytest.mark.parametrize("p", [0.3, 0.5, 0.8])
def test_the_estimator_is_unbiased_where_the_policy_chooses_its_length(p):
    true_gradient = sum(g[0] * _probability(g, p) * sum(_score(a, p) for a in g[2]) for g in GAMES)
    ours = _expected_estimate(
        lambda totals, per_turn: turn_advantages(totals, per_turn, [True] * 3, 3, scale="none"), p
    )
    assert ours == pytest.approx(true_gradient, rel=1e-12, abs=1e-15)
    biased = _expected_estimate(_per_turn_index_baseline, p)
    assert abs(biased - true_gradient) > 1e-3  # what verl #7244 describes


# -- chat episodes and the trainer ---------------------------------------------------------------
def test_turns_and_their_rewards_from_a_chat_episode_in_both_sample_layouts():
    for per_turn in (False, True):
        trajectory, _ = play(per_turn=per_turn)
        spans = turns(trajectory)
        assert len(spans) == 4  # three calls and the final answer
        if per_turn:
            assert [(t.sample, t.start) for t in spans] == [(i, 0) for i in range(4)]
        else:
            assert [(t.start, t.end) for t in spans] == model_turns(trajectory.samples[0].loss_mask)
        assert turn_rewards(trajectory, spans) == [0.5, 0.0, -0.25, 0.0]
        credit = token_credit(trajectory, spans, [1.0, 2.0, 3.0, 4.0])
        for turn, value in zip(spans, (1.0, 2.0, 3.0, 4.0), strict=True):
            assert set(credit[turn.sample][turn.start : turn.end]) == {value}
        unturned = [
            c
            for s, sample in enumerate(trajectory.samples)
            for c, m in zip(credit[s], sample.loss_mask, strict=True)
            if not m
        ]
        assert set(unturned) <= {0.0}


def test_the_trainer_credits_each_turn_with_what_followed_it():
    """Plan A earns 0.5, 0, -0.25 (reward 0.25), plan B earns 1.0 (reward 1.0). Rewards to go:
    A (0.25, -0.25, -0.25, 0.0), B (1.0, 0.0); turn by turn the other member's is the
    baseline where it reached that turn."""
    tokenizer = tiny_tokenizer()
    agent = Agent(ScriptedEngine(follow_the_plan(tokenizer)), tokenizer, parser="hermes")
    plans = itertools.cycle([PLAN, (1.0,)])
    args = GRPOConfig(prompts_per_step=1, num_generations=2, credit="turn", scale_rewards="none")
    sampler = Sampler(
        agent, EveryRow(lambda: toolgym.as_environment(Points(next(plans)))), [ROW], args
    )
    a, b = sampler.play(step=0, policy_version=0).trajectories
    credit = batch_credit(
        [a, b], [(a.reward, True), (b.reward, True)], [0, 1], 2, "none", lambda x: x
    )
    expected = {id(a): [0.25 - 1.0, -0.25 - 0.0, -0.25, 0.0], id(b): [1.0 - 0.25, 0.0 - -0.25]}
    rows = training_samples([a, b], [0.0, 0.0], [True, True], turn_credit=credit)
    for row, trajectory in zip(rows, (a, b), strict=True):
        batch = collate([row], pad_id=0)
        start = len(row.sample.prompt_ids)
        got = batch.token_advantages[0, start : start + len(row.sample.completion_ids)]
        for (begin, end), value in zip(
            model_turns(row.sample.loss_mask), expected[id(trajectory)], strict=True
        ):
            assert got[begin:end].tolist() == pytest.approx([value] * (end - begin), abs=1e-6)
    with pytest.raises(ValueError, match='use step_rewards="return"'):
        GRPOConfig(credit="turn", step_rewards="tokens")
    with pytest.raises(ValueError, match="unknown credit"):
        GRPOConfig(credit="token")
