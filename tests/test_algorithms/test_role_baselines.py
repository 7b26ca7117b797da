"""Per-role baselines (`toolgym.algorithms.role_baselines`) against hand-computed values, and a
GRPO step of an episode with two roles (a proposer and a solver, scored apart)."""

from __future__ import annotations

import math

import pytest
from helpers import ids, tiny_grpo_args, trained_step

from toolgym.agents import AgentLimits, ScriptedEngine, Trajectory
from toolgym.agents.trajectory import Sample
from toolgym.algorithms.role_baselines import (
    needs_roles,
    role_advantages,
    role_credit,
    role_rewards,
)

EPS = 1e-4  # group_advantages' default, added to the std


def test_each_role_is_compared_with_the_same_role_in_its_group():
    episodes = [
        {"policy": 1.0, "solver": 0.0},
        {"policy": 0.0, "solver": 1.0},
        {"policy": 1.0},  # plays no solver: not in the solver's baseline
        {"policy": 0.0, "solver": 0.5},
    ]
    none = role_advantages(episodes, [9.0] * 4, [True] * 4, 4, scale="none")
    assert none == [
        {"policy": 0.5, "solver": -0.5},
        {"policy": -0.5, "solver": 0.5},
        {"policy": 0.5},
        {"policy": -0.5, "solver": 0.0},
    ]
    scaled = role_advantages(episodes, [9.0] * 4, [True] * 4, 4, scale="group")
    policy_std = math.sqrt(4 * 0.25 / 3)  # unbiased, over 1, 0, 1, 0
    solver_std = math.sqrt((0.25 + 0.25 + 0.0) / 2)  # over 0, 1, 0.5
    assert scaled[0]["policy"] == pytest.approx(0.5 / (policy_std + EPS), rel=1e-6)
    assert scaled[1]["solver"] == pytest.approx(0.5 / (solver_std + EPS), rel=1e-6)
    rloo = role_advantages(episodes, [9.0] * 4, [True] * 4, 4, baseline="rloo", scale="none")
    assert rloo[0]["solver"] == pytest.approx(0.0 - (1.0 + 0.5) / 2)  # the others' mean
    assert rloo[2]["policy"] == pytest.approx(1.0 - (1.0 + 0.0 + 0.0) / 3)


def test_a_role_without_two_valid_players_in_its_group_takes_the_episodes_advantage():
    episodes = [{"policy": 1.0, "helper": 1.0}, {"policy": 0.0}, {"policy": 1.0}, {"policy": 0.0}]
    advantages = role_advantages(episodes, [0.7, -0.7, 0.7, -0.7], [True] * 4, 4, scale="none")
    assert advantages[0] == {"policy": 0.5, "helper": 0.7}  # no helper baseline: 0.7 kept
    # an invalid episode (an infrastructure failure) is in no role's baseline
    two = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, {"a": 5.0, "b": 5.0}]
    advantages = role_advantages(two, [0.0] * 3, [True, True, False], 3, scale="none")
    assert advantages[0] == {"a": 0.5, "b": -0.5} and advantages[2] == {"a": 0.0, "b": 0.0}


def episode(reward: float, roles: list[str], role_scores: dict | None = None) -> Trajectory:
    samples = [Sample([1], [2, 3], [1, 1], [-0.1, -0.1], role=role) for role in roles]
    for index, sample in enumerate(samples[1:]):
        sample.parent = index
    trajectory = Trajectory(samples, reward=reward)
    trajectory.role_rewards = dict(role_scores or {})
    return trajectory


def test_one_role_and_no_role_rewards_change_nothing():
    trajectories = [episode(1.0, ["policy"]), episode(0.0, ["policy", "policy"])]
    assert role_rewards(trajectories[1]) == {"policy": 0.0}
    assert not needs_roles([role_rewards(t) for t in trajectories], [1.0, 0.0])
    credit = role_credit(trajectories, [0, 1], [1.0, -1.0], [True, True], 2, "grpo", "none", list)
    assert credit is None
    assert needs_roles([{"policy": 0.5}], [1.0])  # a role scored apart from the episode


def test_role_credit_gives_each_samples_tokens_its_roles_advantage_and_step_rewards():
    trajectories = [
        episode(1.0, ["proposer", "solver"], {"proposer": 0.0}),
        episode(0.0, ["proposer", "solver"], {"proposer": 1.0}),
    ]
    trajectories[0].step_rewards = [{"sample": 1, "start": 0, "end": 1, "reward": 0.25}]
    credit = role_credit(trajectories, [0, 1], [0.5, -0.5], [True, True], 2, "grpo", "none", list)
    assert credit == [[[-0.5, -0.5], [0.5, 0.5]], [[0.5, 0.5], [-0.5, -0.5]]]
    stepped = role_credit(
        trajectories, [0, 1], [0.5, -0.5], [True, True], 2, "grpo", "none", list, step_credit=True
    )
    assert stepped is not None and stepped[0][1] == [0.75, 0.5]  # the step's token gets 0.25


async def propose_and_solve(ctx, env):
    """A proposer writes a number; a solver, in a sample of its own, doubles it. The solver
    scores 1 if right; the proposer scores 1 if the solver failed (an adversarial pair)."""
    trajectory = ctx.start(role="proposer")
    problem = await ctx.generate(trajectory)
    task = [{"role": "user", "content": f"Double {problem.text.strip()}."}]
    ctx.continue_from(trajectory, task, role="solver")
    answer = await ctx.generate(trajectory)
    right = answer.text.strip() == str(2 * int(problem.text.strip()))
    trajectory.role_rewards = {"solver": float(right), "proposer": float(not right)}
    ctx.reward = float(right)
    return trajectory


@pytest.mark.timeout(300)
def test_a_grpo_step_with_two_roles_gives_each_its_own_baseline(tmp_path):
    from toolgym.algorithms import GRPOTrainer
    from toolgym.testing import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    numbers = iter(["3", "4"])

    def reply(prompt_ids: list[int]) -> list[int]:
        """Proposers write 3, then 4; the solver doubles 3 and gets 4 wrong."""
        text = tokenizer.decode(prompt_ids)
        answer = {"Double 3.": "6", "Double 4.": "9"}
        solved = [a for problem, a in answer.items() if problem in text]
        return ids(tokenizer, (solved[0] if solved else next(numbers)) + "<|im_end|>")

    args = tiny_grpo_args(
        tmp_path,
        limits=AgentLimits(max_turns=2, max_new_tokens=8),
        parser="auto",
        batch_wait=5.0,  # both episodes' requests in one batch, in a fixed order
        scale_rewards="none",
    )
    trainer = GRPOTrainer(
        tiny_model(tokenizer),
        "Arithmetic-v0",
        [{"prompt": "Write a number.", "a": 1, "b": 1}],
        args=args,
        tokenizer=tokenizer,
        engine=ScriptedEngine(reply),
        rollout_fn=propose_and_solve,
    )
    _, trajectories = trained_step(trainer, tmp_path)
    roles = [[(s.role, s.parent) for s in t.samples] for t in trajectories]
    assert roles == [[("proposer", None), ("solver", 0)]] * 2
    scores = sorted((t.role_rewards["solver"], t.role_rewards["proposer"]) for t in trajectories)
    assert scores == [(0.0, 1.0), (1.0, 0.0)]
    credit = role_credit(trajectories, [0, 1], [0.0, 0.0], [True, True], 2, "grpo", "none", list)
    assert credit is not None
    for trajectory, (proposer, solver) in zip(trajectories, credit, strict=True):
        right = trajectory.role_rewards["solver"] == 1.0
        assert set(solver) == {0.5 if right else -0.5}  # solvers against solvers
        assert set(proposer) == {-0.5 if right else 0.5}  # proposers against proposers
