"""Dynamic sampling (issue 44 item 2): groups whose rewards are all equal are replaced by groups
of fresh rows played in extra rounds, within a bound, the step's batch staying as configured.
Scripted episodes; which rows carry signal is set by a dataset column."""

from __future__ import annotations

import pytest

import toolgym
from toolgym.agents import Agent, ScriptedEngine
from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.dynamic_sampling import (
    Played,
    extra_rows,
    fill_with_signal,
    has_signal,
)
from toolgym.algorithms.environments import EveryRow
from toolgym.algorithms.sampler import Sampler
from toolgym.testing import tiny_tokenizer


class Quiet(toolgym.Environment):
    """No tools; the reward comes from the reward function."""

    def reset(self, **_) -> str:
        return "Say anything."


def member_parity_if_varies(varies, **_):  # the `i` column is read by the tests
    """A varying row's members score 0, 1, 0, 1...; the others all 0 (no signal)."""
    return [float(v and i % 2) for i, v in enumerate(varies)]


def _episode(reward: float, status: str = "finished") -> Trajectory:
    trajectory = Trajectory(status=status)
    trajectory.append([1, 2], sampled=True)
    trajectory.reward = reward
    return trajectory


def test_a_group_has_signal_when_its_update_members_rewards_differ():
    assert has_signal([_episode(0.0), _episode(1.0)])
    assert not has_signal([_episode(1.0), _episode(1.0)])
    assert not has_signal([_episode(0.0), _episode(1.0, status="env_error")])  # one member left
    assert not has_signal([_episode(0.0), _episode(1.0, status="length")], mask_truncated=True)


def test_with_step_credit_a_step_reward_on_a_members_tokens_is_signal():
    """`step_rewards="tokens"` adds step rewards to their spans' tokens, not to the reward: a
    group of equal rewards where a member's turn cost an invalid call still teaches."""
    penalised = _episode(1.0)
    penalised.step_rewards.append({"sample": 0, "start": 0, "end": 2, "reward": -1.0})
    group = [_episode(1.0), penalised]
    assert has_signal(group, step_credit=True)
    assert not has_signal(group)  # "return" already put it in the reward; "ignore" drops it
    zero = _episode(1.0)
    zero.step_rewards.append({"sample": 0, "start": 0, "end": 2, "reward": 0.0})
    assert not has_signal([_episode(1.0), zero], step_credit=True)
    assert not has_signal([penalised, _episode(1.0, status="env_error")], step_credit=True)


def test_extra_rows_are_seeded_per_step_and_round():
    rows = [{"i": i} for i in range(10)]
    first = extra_rows(rows, 4, seed=0, step=3, round_=1)
    assert extra_rows(rows, 4, seed=0, step=3, round_=1) == first  # a resumed run draws the same
    assert extra_rows(rows, 4, seed=0, step=3, round_=2) != first
    assert extra_rows(rows, 4, seed=0, step=4, round_=1) != first
    assert len({r["i"] for r in first[0]}) == 4  # without repeats while the dataset allows
    assert len(extra_rows(rows[:2], 5, seed=0, step=0, round_=1)[0]) == 5


def _played(rewards_per_group):
    groups = [[_episode(r) for r in rewards] for rewards in rewards_per_group]
    sources = [{"fn": list(rewards)} for rewards in rewards_per_group]
    return Played(groups, sources, {"logged": [float(len(groups))]})


def test_fill_with_signal_keeps_signal_in_order_tops_up_and_stops_when_full():
    rounds = {1: _played([[2, 2], [0, 3]]), 2: _played([[5, 6], [7, 8]])}
    asked = []

    def play_round(r):
        asked.append(r)
        return rounds[r]

    trajectories, sources, logged, figures = fill_with_signal(
        _played([[0, 1], [1, 1]]), play_round, wanted=2, rounds=3
    )
    assert asked == [1]  # full after the first extra round
    assert [t.reward for t in trajectories] == [0, 1, 0, 3]
    assert sources == {"fn": [0, 1, 0, 3]} and logged == {"logged": [2.0, 2.0]}
    assert figures == {
        "dynamic_rounds": 1.0,
        "dynamic_groups_played": 4.0,
        "dynamic_groups_kept_without_signal": 0.0,
    }
    # the bound: no round finds enough, the step's own signal-less groups fill the batch
    trajectories, _, _, figures = fill_with_signal(
        _played([[1, 1], [0, 1]]), lambda r: _played([[4, 4], [4, 4]]), wanted=2, rounds=2
    )
    assert [t.reward for t in trajectories] == [0, 1, 1, 1]
    assert figures["dynamic_rounds"] == 2 and figures["dynamic_groups_played"] == 6
    assert figures["dynamic_groups_kept_without_signal"] == 1


def _sampler(varies: list[bool], **settings) -> Sampler:
    tokenizer = tiny_tokenizer()
    agent = Agent(ScriptedEngine([[*tokenizer.encode("hi"), tokenizer.eos_token_id]]), tokenizer)
    rows = [
        {"prompt": [{"role": "user", "content": "Go."}], "varies": v, "i": i}
        for i, v in enumerate(varies)
    ]
    args = GRPOConfig(
        prompts_per_step=2, num_generations=2, env_reward=False, dynamic_sampling=True, **settings
    )
    return Sampler(agent, EveryRow(Quiet), rows, args, [member_parity_if_varies])


def test_the_sampler_replaces_signal_less_groups_with_fresh_ones():
    # one row of six without signal: every round of two rows holds at least one with signal
    sampler = _sampler([False, True, True, True, True, True], dynamic_sampling_rounds=2)
    for step in range(4):
        rollouts = sampler.play(step, policy_version=0)
        groups = [rollouts.trajectories[i : i + 2] for i in (0, 2)]
        assert len(rollouts.trajectories) == 4 and rollouts.share == [0, 1, 2, 3]
        assert all(has_signal(g) for g in groups), step
        assert rollouts.sources["member_parity_if_varies"] == [
            t.reward for t in rollouts.trajectories
        ]
        assert rollouts.figures["dynamic_groups_kept_without_signal"] == 0
        assert rollouts.figures["dynamic_rounds"] <= 1


def test_when_no_round_finds_signal_the_step_keeps_its_own_groups():
    sampler = _sampler([False] * 4, dynamic_sampling_rounds=3)
    rows, _ = sampler.step_rows(0)
    rollouts = sampler.play(0, policy_version=0)
    assert rollouts.figures == {
        "dynamic_rounds": 3.0,
        "dynamic_groups_played": 8.0,
        "dynamic_groups_kept_without_signal": 2.0,
    }
    assert [t.row["i"] for t in rollouts.trajectories] == [r["i"] for r in rows]  # the step's own


def test_dynamic_sampling_refuses_several_processes_and_a_zero_bound():
    tokenizer = tiny_tokenizer()
    agent = Agent(ScriptedEngine([[1]]), tokenizer)
    args = GRPOConfig(prompts_per_step=2, num_generations=2, dynamic_sampling=True)
    with pytest.raises(ValueError, match="one process for now"):
        Sampler(agent, EveryRow(Quiet), [{"varies": True}], args, process=(0, 2))
    with pytest.raises(ValueError, match="dynamic_sampling_rounds must be at least 1"):
        GRPOConfig(dynamic_sampling_rounds=0)
