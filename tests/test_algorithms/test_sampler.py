"""The sampler plays and scores training steps with nothing of the learner: an agent, what
makes environments, the rows and the scoring (issue 25 item 6: the part the cluster work
distributes)."""

from __future__ import annotations

from helpers import GUESS, ids, wordle_rows

import toolgym
from toolgym.agents import Agent, ScriptedEngine
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.environments import EveryRow
from toolgym.algorithms.sampler import Sampler
from toolgym.testing import tiny_tokenizer


def guesses_made(prompts, completions, trajectories, **_):
    return [float(t.metrics["tool_calls"]) for t in trajectories]


def test_a_sampler_plays_groups_from_one_seed_and_scores_them_without_a_learner():
    tokenizer = tiny_tokenizer()
    seen = []

    def reply(prompt_ids):
        seen.append(len(prompt_ids))
        return ids(tokenizer, GUESS.format(word="crane"))

    agent = Agent(ScriptedEngine(reply), tokenizer, parser="hermes")
    args = GRPOConfig(prompts_per_step=2, num_generations=3, seed=5, reward_weights=[1.0, 0.5])
    sampler = Sampler(
        agent, EveryRow(lambda: toolgym.make("Wordle-v0")), wordle_rows(4), args, [guesses_made]
    )
    rows, seeds = sampler.step_rows(0)
    assert len(rows) == 6 and seeds[:3] == [seeds[0]] * 3 and seeds[3] != seeds[0]
    assert sampler.step_rows(0) == (rows, seeds)  # seeded: a resumed run draws the same
    rollouts = sampler.play(step=0, policy_version=7)
    assert rollouts.policy_version == 7 and rollouts.share == list(range(6))
    for trajectory in rollouts.trajectories:
        assert trajectory.status == "env_done"  # crane is every row's answer here
        env, calls = trajectory.reward_sources["env"], trajectory.reward_sources["guesses_made"]
        assert trajectory.reward == env + 0.5 * calls
    evaluation = sampler.evaluate(wordle_rows(2))
    assert [t.status for t in evaluation] == ["env_done", "env_done"]


def test_each_process_plays_its_share():
    agent = Agent(ScriptedEngine([[1]]), tiny_tokenizer(), parser="hermes")
    args = GRPOConfig(prompts_per_step=2, num_generations=2)
    second = Sampler(agent, EveryRow(lambda: None), wordle_rows(2), args, process=(1, 2))
    assert second.share(4) == [2, 3]
