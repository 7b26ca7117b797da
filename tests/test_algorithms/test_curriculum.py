"""A difficulty curriculum (issue 44 item 1): rows declare a `difficulty`, each step trains one
level, the level moves with the measured success rate, the level is in the metrics and
`summarize`, and a checkpoint keeps the state so a resumed run draws what the uninterrupted one
would. Scripted episodes; success is set by a reward function of the row's difficulty."""

from __future__ import annotations

import json

import pytest

import toolgym
from toolgym.agents import Agent, ScriptedEngine
from toolgym.agents.trajectory import Trajectory, summarize
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.curriculum import Curriculum, load_curriculum, save_curriculum
from toolgym.algorithms.environments import EveryRow
from toolgym.algorithms.sampler import Sampler
from toolgym.testing import tiny_tokenizer

SKILL = 2  # the scripted policy wins every level up to this difficulty


class Quiet(toolgym.Environment):
    def reset(self, **_) -> str:
        return "Say anything."


def wins_up_to_skill(difficulty, **_):
    return [float(d <= SKILL) for d in difficulty]


def _rows(levels=(1, 2, 3), per_level=3):
    return [
        {"prompt": [{"role": "user", "content": "Go."}], "difficulty": d, "i": i}
        for d in levels
        for i in range(per_level)
    ]


def test_levels_draws_and_moves():
    curriculum = Curriculum(_rows(), window=2, promote_at=0.6, demote_at=0.1, seed=3)
    assert curriculum.levels == [1.0, 2.0, 3.0] and curriculum.difficulty == 1.0
    drawn = curriculum.draw(4)  # one shuffle of the level's three rows, then the next
    assert {r["difficulty"] for r in drawn} == {1}
    assert sorted(r["i"] for r in drawn[:3]) == [0, 1, 2]
    again = Curriculum(_rows(), window=2, seed=3)
    assert again.draw(4) == drawn  # seeded
    curriculum.observe(1.0)
    assert curriculum.level == 0  # the window is not full yet
    curriculum.observe(0.5)
    assert curriculum.level == 1 and curriculum.recent == [] and curriculum.moves == 1  # 0.75
    for rate in (1.0, 1.0, 1.0, 1.0):
        curriculum.observe(rate)
    assert curriculum.level == 2  # the top: no level above to open
    for rate in (0.0, 0.3, 0.0):  # windows (1, 0), (0, 0.3), (0.3, 0): above 0.1, it stays
        curriculum.observe(rate)
    assert curriculum.level == 2
    curriculum.observe(0.0)  # (0, 0): at or below the demotion threshold
    assert curriculum.level == 1 and curriculum.moves == 3


def test_the_state_round_trips_and_bad_settings_are_refused(tmp_path):
    curriculum = Curriculum(_rows(), window=1)
    curriculum.draw(2)
    curriculum.observe(1.0)
    curriculum.draw(5)
    save_curriculum(curriculum, tmp_path)
    resumed = Curriculum(_rows(), window=1)
    load_curriculum(resumed, tmp_path)
    assert resumed.state_dict() == curriculum.state_dict()
    assert resumed.draw(3) == curriculum.draw(3)  # the same rows next
    with pytest.raises(ValueError, match="resume with the same dataset"):
        load_curriculum(Curriculum(_rows(levels=(1, 5))), tmp_path)
    with pytest.warns(UserWarning, match="holds no curriculum state"):
        load_curriculum(Curriculum(_rows()), tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"needs a `difficulty` column in every row; rows \[3\]"):
        Curriculum([*_rows(levels=(1,)), {"prompt": "x"}])
    with pytest.raises(ValueError, match="curriculum_demote_at < curriculum_promote_at"):
        Curriculum(_rows(), promote_at=0.1, demote_at=0.5)


def _sampler(**settings) -> Sampler:
    """A sampler of scripted episodes over `_rows()` with a curriculum and `settings`."""
    tokenizer = tiny_tokenizer()
    agent = Agent(ScriptedEngine([[*tokenizer.encode("hi"), tokenizer.eos_token_id]]), tokenizer)
    args = GRPOConfig(
        prompts_per_step=2, num_generations=2, env_reward=False, curriculum=True, **settings
    )
    return Sampler(agent, EveryRow(Quiet), _rows(), args, [wins_up_to_skill])


def test_the_sampler_trains_the_level_the_success_rate_chooses():
    sampler = _sampler(curriculum_window=1)
    levels = []
    for step in range(6):
        rollouts = sampler.play(step, policy_version=0)
        level = rollouts.figures["curriculum_level"]
        assert {t.row["difficulty"] for t in rollouts.trajectories} == {level}
        levels.append(level)
        rate = sum(t.reward >= 1.0 for t in rollouts.trajectories) / len(rollouts.trajectories)
        sampler.curriculum.observe(rate)  # as the trainer does after each step
    # up while it wins, down from the level it loses, and back up: it trains at its edge
    assert levels == [1.0, 2.0, 3.0, 2.0, 3.0, 2.0]
    summary = summarize(rollouts.trajectories)
    assert summary["difficulty/2/success_rate"] == 1.0 and summary["difficulty/2/episodes"] == 4


def _finished(row: dict, reward: float) -> Trajectory:
    trajectory = Trajectory(row=row)
    trajectory.reward = reward
    trajectory.metrics.update(turns=1, tool_calls=0, tool_failures=0)
    return trajectory


def test_summarize_reports_each_declared_difficulty():
    episodes = [_finished({"difficulty": d}, r) for d, r in ((1, 1.0), (1, 0.0), (3, 0.0))]
    summary = summarize(episodes)
    assert summary["difficulty/1/success_rate"] == 0.5 and summary["difficulty/1/episodes"] == 2
    assert summary["difficulty/3/reward"] == 0.0
    assert not any(k.startswith("difficulty/") for k in summarize([_finished({}, 1.0)]))


def test_the_trainer_logs_the_level_and_its_checkpoint_keeps_the_state(tmp_path):
    from helpers import train_tool_caller

    from toolgym.agents import AgentLimits
    from toolgym.algorithms import GRPOTrainer

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=2, max_new_tokens=20, max_episode_tokens=300),
        parser="hermes",
        env_reward=False,
        curriculum=True,
        curriculum_window=1,
        progress_bar=False,
    )
    trainer = GRPOTrainer(
        train_tool_caller(tokenizer), Quiet, _rows(), reward_funcs=[wins_up_to_skill],
        args=args, tokenizer=tokenizer,
    )  # fmt: skip
    history = trainer.train()
    assert [m["curriculum_level"] for m in history] == [1.0, 2.0]  # it wins both
    assert history[-1]["curriculum_moves"] == 2
    saved = json.loads((tmp_path / "checkpoint-2" / "curriculum.json").read_text())
    assert saved == trainer.sampler.curriculum.state_dict() and saved["level"] == 2


def test_dynamic_sampling_draws_its_fresh_rows_from_the_level_being_trained():
    sampler = _sampler(dynamic_sampling=True, dynamic_sampling_rounds=2)  # no signal anywhere
    rollouts = sampler.play(0, policy_version=0)
    assert rollouts.figures["dynamic_rounds"] == 2
    assert sampler.curriculum.drawn == {0: 6}  # the step's two rows and two per round
    assert {t.row["difficulty"] for t in rollouts.trajectories} == {1}
