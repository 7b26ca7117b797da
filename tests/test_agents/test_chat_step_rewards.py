"""A tool call's step reward in a chat episode (`StepResult.reward`, the change of the
environment's reward) is kept with the assistant turn that made the call and reaches
training as inline step rewards do (issue 31 item 1): `step_rewards="tokens"` credits it to
that turn's tokens on top of the group advantage; it is part of the episode's reward already,
so no mode counts it twice. Scripted episodes, expectations computed by hand."""

from __future__ import annotations

import itertools
import math

import pytest
from helpers import ids
from points_game import (
    PLAN,
    ROW,
    Points,
    follow_the_plan,
    model_turns,
    plan_replies,
    play,
)

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine, Trajectory
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.advantages import group_advantages
from toolgym.algorithms.batch import collate, training_samples
from toolgym.algorithms.environments import EveryRow
from toolgym.algorithms.rewards import step_reward_bonus, step_reward_total
from toolgym.algorithms.sampler import Sampler
from toolgym.testing import tiny_tokenizer


def test_a_tool_calls_reward_credits_exactly_the_tokens_of_the_turn_that_made_it():
    trajectory, agent = play()
    (sample,) = trajectory.samples
    turns = model_turns(sample.loss_mask)  # four turns: three calls and the final answer
    replies = plan_replies(agent.tokenizer, PLAN)
    assert [end - start for start, end in turns] == [len(r) for r in replies]
    (first, _, third, _) = turns
    assert trajectory.step_rewards == [
        {"sample": 0, "start": first[0], "end": first[1], "reward": 0.5, "in_reward": 1},
        {"sample": 0, "start": third[0], "end": third[1], "reward": -0.25, "in_reward": 1},
    ]
    assert sample.completion_ids[third[0] : third[1]] == replies[2]  # the call of -0.25

    expected = [0.0] * len(sample.completion_ids)  # by hand: each call's points on its turn
    expected[first[0] : first[1]] = [0.5] * (first[1] - first[0])
    expected[third[0] : third[1]] = [-0.25] * (third[1] - third[0])
    (row,) = training_samples([trajectory], [0.7], step_credit=True)
    assert row.bonus == expected
    batch = collate([row], pad_id=0)
    prompt = len(sample.prompt_ids)
    credited = batch.token_advantages[0, prompt : prompt + len(expected)]
    assert credited.tolist() == pytest.approx([0.7 + b for b in expected])
    assert batch.token_advantages[0, :prompt].tolist() == pytest.approx([0.7] * prompt)
    # on sampled tokens, only the two rewarded turns differ from the advantage
    mask = batch.loss_mask[0, prompt : prompt + len(expected)].tolist()
    moved = [i for i, (m, b) in enumerate(zip(mask, expected, strict=True)) if m and b]
    assert moved == [*range(*first), *range(*third)]
    (plain,) = training_samples([trajectory], [0.7], step_credit=False)
    assert plain.bonus is None


def test_per_turn_samples_carry_the_credit_of_their_own_turn():
    trajectory, agent = play(per_turn=True)
    replies = plan_replies(agent.tokenizer, PLAN)
    assert [s.completion_ids for s in trajectory.samples] == replies  # one sample per turn
    assert trajectory.step_rewards == [
        {"sample": 0, "start": 0, "end": len(replies[0]), "reward": 0.5, "in_reward": 1},
        {"sample": 2, "start": 0, "end": len(replies[2]), "reward": -0.25, "in_reward": 1},
    ]
    rows = training_samples([trajectory], [0.0], step_credit=True)
    assert [row.bonus for row in rows] == [
        [0.5] * len(replies[0]),
        None,
        [-0.25] * len(replies[2]),
        None,
    ]
    assert step_reward_bonus(trajectory) == [0.0] * len(replies[3])  # the last sample's


def test_a_saved_trajectory_keeps_its_turns_credit(tmp_path):
    from toolgym.agents.trajectory import load_jsonl, save_jsonl

    trajectory, _ = play(per_turn=True)
    save_jsonl([trajectory], tmp_path / "samples.jsonl")
    (loaded,) = load_jsonl(tmp_path / "samples.jsonl")
    assert loaded.step_rewards == trajectory.step_rewards
    before = training_samples([trajectory], step_credit=True)
    after = training_samples([loaded], step_credit=True)
    assert [r.bonus for r in after] == [r.bonus for r in before]


@pytest.mark.parametrize("mode", ["return", "tokens", "ignore"])
def test_the_trainer_counts_a_chat_step_reward_once_and_credits_its_turn_in_tokens_mode(mode):
    """A group of two: plan A earns 0.5, 0, -0.25 (reward 0.25), plan B earns 1.0 (reward 1).
    The episode's reward already holds its step rewards in every mode (never twice); the GRPO
    advantages are +-1/sqrt(2) (mean 0.625, sample std 0.375 * sqrt(2)); "tokens" adds each
    turn's reward to its tokens."""
    tokenizer = tiny_tokenizer()
    agent = Agent(ScriptedEngine(follow_the_plan(tokenizer)), tokenizer, parser="hermes")
    plans = itertools.cycle([PLAN, (1.0,)])
    args = GRPOConfig(prompts_per_step=1, num_generations=2, step_rewards=mode)
    sampler = Sampler(
        agent, EveryRow(lambda: toolgym.as_environment(Points(next(plans)))), [ROW], args
    )
    a, b = sampler.play(step=0, policy_version=0).trajectories
    assert [a.reward, b.reward] == pytest.approx([0.25, 1.0])  # the environment's, once
    assert [a.reward_sources["env"], b.reward_sources["env"]] == pytest.approx([0.25, 1.0])
    assert a.reward_sources["step_rewards"] == b.reward_sources["step_rewards"] == 0.0
    assert [s["reward"] for s in a.step_rewards] == [0.5, -0.25]
    assert [s["reward"] for s in b.step_rewards] == [1.0]

    advantages, used = group_advantages([a.reward, b.reward], [True, True], 2)
    half = 1 / math.sqrt(2) * 0.375 * math.sqrt(2) / (0.375 * math.sqrt(2) + 1e-4)
    assert advantages.tolist() == pytest.approx([-half, half], abs=1e-6)
    rows = training_samples([a, b], advantages, used, step_credit=mode == "tokens")
    for row, trajectory, advantage in zip(rows, (a, b), (-half, half), strict=True):
        sample = trajectory.samples[0]
        batch = collate([row], pad_id=0)
        start = len(sample.prompt_ids)
        got = batch.token_advantages[0, start : start + len(sample.completion_ids)].tolist()
        want = [advantage] * len(sample.completion_ids)
        if mode == "tokens":  # by hand: the turns that made the calls, from the mask
            turns = model_turns(sample.loss_mask)
            credits = [0.5, 0.0, -0.25, 0.0] if trajectory is a else [1.0, 0.0]
            for (begin, end), credit in zip(turns, credits, strict=True):
                want[begin:end] = [advantage + credit] * (end - begin)
        assert got == pytest.approx(want, abs=1e-6)


def test_inline_step_rewards_still_join_the_return_and_chat_ones_do_not():
    trajectory = Trajectory()
    trajectory.append([1, 2, 3, 4, 5, 6], sampled=True)
    trajectory.step_rewards = [
        {"end": 2, "reward": -0.3},  # inline: outside the environment's reward
        {"sample": 0, "start": 3, "end": 5, "reward": 0.5, "in_reward": 1},  # a tool call's
    ]
    assert step_reward_total(trajectory) == pytest.approx(-0.3)
    assert step_reward_bonus(trajectory) == pytest.approx([-0.3, -0.3, 0.0, 0.5, 0.5, 0.0])
    trajectory.step_rewards.append({"sample": 3, "end": 1, "reward": 1.0})
    with pytest.raises(ValueError, match="names sample 3 of 1"):
        step_reward_bonus(trajectory)


def test_a_plain_class_reward_read_at_the_end_is_no_turns_credit():
    """A class without per-step rewards reports its episode reward at the step that ends the
    episode: that is the episode's reward, not that turn's, and is not recorded."""

    class Once:
        def reset(self, **_):
            self.total = 0.0

        def add(self, points: float) -> str:
            """Add points.

            Args:
                points: How many.
            """
            self.total += points
            return "ok"

        def get_reward(self) -> float:
            return self.total

    tokenizer = tiny_tokenizer()
    agent = Agent(ScriptedEngine(plan_replies(tokenizer, (0.5,))), tokenizer, parser="hermes")
    (trajectory,) = agent.run([toolgym.as_environment(Once())], [dict(ROW)])
    assert trajectory.reward == 0.5 and trajectory.step_rewards == []


WRONG_TURNS = [  # each a call refused before any tool ran
    '<tool_call>\n{"name": "subtract", "arguments": {"points": 1}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "add", "arguments": {"points": "many"}}\n</tool_call><|im_end|>',
    "<tool_call>\n{not json\n</tool_call><|im_end|>",
]


def play_wrong_calls(invalid_call_reward: float) -> tuple[Trajectory, list[list[int]]]:
    """An unknown tool, invalid arguments, a malformed call, a call of 0.5 points, then done."""
    tokenizer = tiny_tokenizer()
    replies = [ids(tokenizer, text) for text in WRONG_TURNS] + plan_replies(tokenizer, (0.5,))
    limits = AgentLimits(invalid_call_reward=invalid_call_reward)
    agent = Agent(ScriptedEngine(replies), tokenizer, parser="hermes", limits=limits)
    (trajectory,) = agent.run([toolgym.as_environment(Points((0.5,)))], [dict(ROW)])
    assert trajectory.status == "finished" and trajectory.reward == pytest.approx(0.5)
    assert trajectory.metrics["tool_failures"] == 3
    return trajectory, replies


def test_each_refused_call_costs_its_turn_the_invalid_call_reward_outside_the_env_reward():
    trajectory, replies = play_wrong_calls(-1.0)
    turns = model_turns(trajectory.samples[0].loss_mask)
    assert [end - start for start, end in turns] == [len(r) for r in replies]
    wrong = [
        {"sample": 0, "start": s, "end": e, "reward": -1.0, "in_reward": 0} for s, e in turns[:3]
    ]
    right = {"sample": 0, "start": turns[3][0], "end": turns[3][1], "reward": 0.5, "in_reward": 1}
    assert trajectory.step_rewards == [*wrong, right]
    assert step_reward_total(trajectory) == pytest.approx(-3.0)  # the environment's 0.5 is not
    expected = [0.0] * len(trajectory.completion_ids)  # by hand, from the turns' spans
    for (start, end), credit in zip(turns, [-1.0, -1.0, -1.0, 0.5, 0.0], strict=True):
        expected[start:end] = [credit] * (end - start)
    assert step_reward_bonus(trajectory) == pytest.approx(expected)


def test_no_invalid_call_reward_by_default():
    trajectory, _ = play_wrong_calls(0.0)
    assert [s["reward"] for s in trajectory.step_rewards] == [0.5]


def wrong_call_first_agent() -> Agent:
    """An agent (invalid-call reward -1) that plays plan "0.5, 0" with an unknown call before
    its 0.5-point call, and plan "0.5" with the 0.5-point call alone."""
    tokenizer = tiny_tokenizer()
    good = plan_replies(tokenizer, (0.5,))

    def reply(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        script = [ids(tokenizer, WRONG_TURNS[0]), *good] if "Plan: 0.5, 0<" in text else good
        return script[text.count("total ") + text.count("Error")]

    limits = AgentLimits(invalid_call_reward=-1.0)
    return Agent(ScriptedEngine(reply), tokenizer, parser="hermes", limits=limits)


@pytest.mark.parametrize("mode", ["return", "tokens"])
def test_the_trainer_adds_the_invalid_call_reward_once_in_either_mode(mode):
    """A group of two: one episode makes an unknown call before its 0.5-point call, one makes
    the 0.5-point call alone. "return": the penalty joins the first one's reward (-0.5 against
    0.5); "tokens": both rewards stay 0.5 (no advantage) and the wrong turn alone carries -1."""
    agent = wrong_call_first_agent()
    plans = itertools.cycle([(0.5, 0.0), (0.5,)])
    args = GRPOConfig(prompts_per_step=1, num_generations=2, step_rewards=mode)
    sampler = Sampler(
        agent, EveryRow(lambda: toolgym.as_environment(Points(next(plans)))), [ROW], args
    )
    trajectories = sampler.play(step=0, policy_version=0).trajectories
    wrong, right = trajectories
    assert wrong.reward_sources["env"] == right.reward_sources["env"] == pytest.approx(0.5)
    assert wrong.reward_sources["step_rewards"] == pytest.approx(-1.0)
    if mode == "return":
        assert [wrong.reward, right.reward] == pytest.approx([-0.5, 0.5])
    else:
        assert [wrong.reward, right.reward] == pytest.approx([0.5, 0.5])
        (row,) = training_samples([wrong], [0.0], step_credit=True)
        first = model_turns(wrong.samples[0].loss_mask)[0]
        assert row.bonus[first[0] : first[1]] == [-1.0] * (first[1] - first[0])
        assert set(row.bonus[first[1] :]) == {0.0, 0.5}


def test_an_episode_no_source_scored_stays_unscored_beside_one_with_an_invalid_call_reward():
    """TRL leaves an episode no reward source scored out of its group (reward None). A
    neighbour's invalid-call reward must not turn it into a 0: only an episode with step
    rewards of its own (outside the environment's reward) is scored by them."""

    def only_the_wrong_one(completions, **kwargs):  # scores the episode with the wrong call
        return [1.0 if "Error" in str(c) else None for c in completions]

    agent = wrong_call_first_agent()
    plans = itertools.cycle([(0.5, 0.0), (0.5,)])
    args = GRPOConfig(prompts_per_step=1, num_generations=2, env_reward=False)
    sampler = Sampler(
        agent,
        EveryRow(lambda: toolgym.as_environment(Points(next(plans)))),
        [ROW],
        args,
        reward_funcs=[only_the_wrong_one],
    )
    with pytest.warns(UserWarning, match="1 of 2 episodes got no reward"):
        wrong, right = sampler.play(step=0, policy_version=0).trajectories
    assert wrong.reward == pytest.approx(0.0)  # the function's 1.0 and the -1 of the wrong call
    assert right.reward is None
