"""Credit for groups played as several trees (`toolgym.algorithms.tree_credit`), against
values computed by hand in float64, and against GRPO's own advantages where no episode
shares turns."""

from __future__ import annotations

import random

import pytest
import torch

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.algorithms.advantages import group_advantages
from toolgym.algorithms.tree_credit import member_advantages, tree_credit


def test_two_trees_of_two_by_hand():
    """Rewards 1, 3 (tree a: mean 2) and 0, 2 (tree b: mean 1); the group's mean is 1.5."""
    rewards, trees = [1.0, 3.0, 0.0, 2.0], ["a", "a", "b", "b"]
    grpo = member_advantages(rewards, [True] * 4, trees, "grpo")
    assert grpo == [(0.5, -1.0), (0.5, 1.0), (-0.5, -1.0), (-0.5, 1.0)]
    # rloo: the tree's mean against the other tree's (2 - 1), a member against its sibling
    rloo = member_advantages(rewards, [True] * 4, trees, "rloo")
    assert rloo == [(1.0, -2.0), (1.0, 2.0), (-1.0, -2.0), (-1.0, 2.0)]


def test_a_failed_member_leaves_its_tree_and_the_group_mean():
    rewards, trees = [1.0, 9.0, 3.0, 0.0], ["a", "a", "b", "b"]
    result = member_advantages(rewards, [True, False, True, True], trees, "grpo")
    # tree a: 1 alone (mean 1); tree b: mean 1.5; the group's mean of 1, 3, 0: 4/3
    assert result[1] == (0.0, 0.0)
    assert result[0] == pytest.approx((1 - 4 / 3, 0.0), abs=1e-15)
    assert result[2] == pytest.approx((1.5 - 4 / 3, 1.5), abs=1e-15)
    assert result[3] == pytest.approx((1.5 - 4 / 3, -1.5), abs=1e-15)
    assert member_advantages([1.0, 2.0], [True, False], ["a", "a"]) == [(0.0, 0.0)] * 2


@pytest.mark.parametrize("baseline", ["grpo", "rloo"])
def test_the_shared_turns_get_the_gradient_of_the_members_they_stand_for(baseline):
    """A policy-gradient surrogate sum(A * logprob) over a group of 3 trees of 4: the shared
    turns' gradient (every member holds them, each with its tree's advantage) is the tree's
    summed GRPO advantage (its prefix trained once, for its 4 members), and each member's own
    tokens see its siblings as the baseline; float64, random rewards."""
    generator = random.Random(3)
    for _ in range(20):
        rewards = [generator.choice([0.0, 0.25, 1.0]) + generator.random() for _ in range(12)]
        trees = [i // 4 for i in range(12)]
        pairs = member_advantages(rewards, [True] * 12, trees, baseline)
        prefix = torch.zeros(3, dtype=torch.float64, requires_grad=True)  # a logprob a tree
        own = torch.zeros(12, dtype=torch.float64, requires_grad=True)
        surrogate = sum(s * prefix[trees[i]] + o * own[i] for i, (s, o) in enumerate(pairs))
        surrogate.backward()
        r = torch.tensor(rewards, dtype=torch.float64).view(3, 4)
        means = r.mean(dim=1)
        if baseline == "grpo":
            expected_prefix = 4 * (means - r.mean())
            expected_own = (r - means[:, None]).flatten()
        else:
            others = (means.sum() - means) / 2
            expected_prefix = 4 * (means - others)
            expected_own = (r - (r.sum(dim=1, keepdim=True) - r) / 3).flatten()
        torch.testing.assert_close(prefix.grad, expected_prefix, rtol=0, atol=1e-12)
        torch.testing.assert_close(own.grad, expected_own, rtol=0, atol=1e-12)
        if baseline == "grpo":  # the two parts add up to GRPO's advantage of each member
            plain = [r_i - sum(rewards) / 12 for r_i in rewards]
            assert [s + o for s, o in pairs] == pytest.approx(plain, abs=1e-12)


def trajectory(reward: float, lengths: list[int], shared: list[int] | None = None):
    samples = [Sample([1], [5] * n, [1] * n, [0.0] * n) for n in lengths]
    return Trajectory(samples, reward=reward, shared=shared or [])


def test_tokens_take_the_shared_advantage_up_to_the_cut_and_their_own_after():
    """Two trees of two in a group of 4, scale "none": the first sample shares 3 of its 5
    tokens and the second 2 of its 4 (the root's turns), a third sample is the member's."""
    rewards = [1.0, 3.0, 0.0, 2.0]
    trajectories = [trajectory(r, [5, 4, 2], [3, 2]) for r in rewards]
    everyone = [(r, True) for r in rewards]
    credit = tree_credit(
        trajectories, range(4), everyone, 4, 2, "grpo", "none", lambda values: values
    )
    assert credit[0] == [[0.5] * 3 + [-1.0] * 2, [0.5] * 2 + [-1.0] * 2, [-1.0] * 2]
    assert credit[3] == [[-0.5] * 3 + [1.0] * 2, [-0.5] * 2 + [1.0] * 2, [1.0] * 2]
    scaled = tree_credit(
        trajectories, range(4), everyone, 4, 2, "grpo", "group", lambda values: values
    )
    spread = torch.tensor(rewards, dtype=torch.float64).std().item() + 1e-4
    assert scaled[1][0] == pytest.approx([0.5 / spread] * 3 + [1.0 / spread] * 2, abs=1e-12)


@pytest.mark.parametrize("baseline", ["grpo", "rloo"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_without_shared_turns_the_credit_is_grpos(baseline, scale):
    """Episodes that share nothing (roots that ended before the branch point play alone)
    are trees of one: every token gets `group_advantages`' value, failures included."""
    rewards = [0.0, 1.0, 0.5, 0.25, 2.0, 2.0, 1.0, 0.0]
    valid = [True, True, False, True, True, True, True, True]
    trajectories = [trajectory(r, [3, 2]) for r in rewards]
    everyone = list(zip(rewards, valid, strict=True))
    credit = tree_credit(
        trajectories, range(8), everyone, 4, 2, baseline, scale, lambda values: values
    )
    expected, _ = group_advantages(rewards, valid, 4, baseline=baseline, scale=scale)
    for tokens, value in zip(credit, expected.tolist(), strict=True):
        assert tokens == [pytest.approx([value] * 3, abs=1e-6), pytest.approx([value] * 2)]


def test_step_rewards_credited_to_tokens_add_on_their_spans():
    rewards = [1.0, 3.0, 0.0, 2.0]
    trajectories = [trajectory(r, [5], [3]) for r in rewards]
    trajectories[1].step_rewards = [{"sample": 0, "start": 3, "end": 5, "reward": 0.25}]
    credit = tree_credit(
        trajectories,
        range(4),
        [(r, True) for r in rewards],
        4,
        2,
        "grpo",
        "none",
        lambda values: values,
        step_credit=True,
    )
    assert credit[1] == [[0.5] * 3 + [1.25] * 2]


def test_groups_that_do_not_split_into_trees_are_refused():
    with pytest.raises(ValueError, match="groups of trees"):
        tree_credit([], [], [(0.0, True)] * 4, 4, 3, "grpo", "none", lambda values: values)


def test_a_sub_episode_joined_into_a_member_leaves_its_shared_count_on_its_own_sample():
    """A member's last sample (the one the root's turns began) keeps its shared count when
    a sub-agent's samples are joined in before it."""
    from toolgym.agents.subagents import join_side_samples

    member = trajectory(1.0, [4, 6], [4, 3])
    join_side_samples(member, [(1, trajectory(0.0, [2, 2]), "helper")])
    assert [len(s.completion_ids) for s in member.samples] == [4, 2, 2, 6]
    assert member.shared == [4, 0, 0, 3]


def test_several_roles_are_refused_beside_several_trees(tmp_path):
    from helpers import tiny_grpo_args

    from toolgym.algorithms.credit import assign_credit

    args = tiny_grpo_args(tmp_path, num_generations=4, branch_at_turn=1, tree_size=2)
    trajectories = [trajectory(r, [3], [1]) for r in (0.0, 1.0, 0.0, 1.0)]
    trajectories[0].role_rewards = {"policy": 0.5}
    with pytest.raises(ValueError, match="per-role baselines inside trees"):
        assign_credit(trajectories, list(range(4)), args, lambda values: values)
