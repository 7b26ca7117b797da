"""Partial rollouts (`GRPOConfig.partial_rollouts`): steps whose plays overlap within the
staleness bound, tokens that record the weights that sampled them, and the step figures that
read those records. The vLLM side (requests that go on through a weight update) is in
test_vllm.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from helpers import GUESS, ids

import toolgym
from toolgym.agents import AgentLimits, ScriptedEngine
from toolgym.agents.trajectory import Sample, Trajectory, load_jsonl
from toolgym.algorithms import GRPOConfig, GRPOTrainer
from toolgym.algorithms.pipeline import pipelined_steps
from toolgym.algorithms.policy_versions import PolicyVersions
from toolgym.testing import tiny_model, tiny_tokenizer


class Plays:
    """A scripted producer side: each step's play records when it ran; `slow` steps wait
    until the step after them has started (or `patience` seconds pass)."""

    def __init__(self, slow: set[int], patience: float = 2.0) -> None:
        self.slow, self.patience = slow, patience
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.versions_at_start: dict[int, int] = {}
        self.version = 0
        self.running = self.most_running = 0
        self._lock = threading.Lock()
        self._started = {step: threading.Event() for step in range(20)}

    def play(self, step: int):
        with self._lock:
            self.started[step] = time.perf_counter()
            self.versions_at_start[step] = self.version
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        self._started[step].set()
        if step in self.slow:  # a long tail: it ends once the next step plays beside it
            self._started[step + 1].wait(self.patience)
        with self._lock:
            self.running -= 1
            self.ended[step] = time.perf_counter()
        return SimpleNamespace(step=step)

    def learn(self, batch) -> dict:
        self.version = batch.step + 1  # the learner updated on it; the engine holds it
        return {"step": batch.step}


def run(plays: Plays, steps: int, max_staleness: int, overlap: bool) -> list[dict]:
    learned = [0]

    def keep_going() -> bool:
        return learned[0] < steps

    def learn(batch):
        learned[0] += 1
        return plays.learn(batch)

    return list(
        pipelined_steps(
            range(steps),
            max_staleness,
            lambda: plays.version,
            plays.play,
            learn,
            keep_going,
            lambda why: None,
            overlap=overlap,
        )
    )


def test_overlapping_plays_start_a_step_while_the_slow_one_before_it_still_plays():
    plays = Plays(slow={0, 2})
    history = run(plays, steps=5, max_staleness=1, overlap=True)
    assert [m["step"] for m in history] == [0, 1, 2, 3, 4]  # learned in order
    for slow in (0, 2):  # the next step started before the slow one ended: no drain
        assert plays.started[slow + 1] < plays.ended[slow]
    assert plays.most_running == 2  # max_staleness + 1 at most
    for step, version in plays.versions_at_start.items():
        assert version >= step - 1  # never further behind than the bound


def test_without_overlap_a_step_starts_only_after_the_one_before_has_ended():
    plays = Plays(slow={0, 2}, patience=0.3)
    history = run(plays, steps=5, max_staleness=1, overlap=False)
    assert [m["step"] for m in history] == [0, 1, 2, 3, 4]
    assert plays.most_running == 1
    for step in range(1, 5):
        assert plays.started[step] >= plays.ended[step - 1]


def test_the_bound_holds_with_more_staleness_and_a_play_error_reaches_the_learner():
    plays = Plays(slow=set())
    run(plays, steps=6, max_staleness=2, overlap=True)
    assert plays.most_running <= 3
    assert all(v >= step - 2 for step, v in plays.versions_at_start.items())

    def broken(step: int):
        if step == 1:
            raise RuntimeError("the engine died")
        return SimpleNamespace(step=step)

    steps = pipelined_steps(
        range(4), 1, lambda: 0, broken, lambda b: {}, lambda: True, lambda why: None, True
    )
    with pytest.raises(RuntimeError, match="the engine died"):
        list(steps)


def test_a_spent_budget_stops_the_plays_and_the_learner_after_the_steps_before_it():
    version = [0]
    played: list[int] = []

    def play(step: int):
        played.append(step)
        return "max_seconds" if step == 2 else SimpleNamespace(step=step)

    def learn(batch):
        version[0] = batch.step + 1
        return {"step": batch.step}

    why: list[str] = []
    history = list(
        pipelined_steps(
            range(10), 1, lambda: version[0], play, learn, lambda: True, why.append, True
        )
    )
    assert [m["step"] for m in history] == [0, 1] and why == ["max_seconds"]
    assert max(played) <= 3  # nothing past the bound after the stop


def test_sample_versions_follow_the_tokens_and_survive_a_round_trip():
    sample = Sample([1, 2])
    sample.append([5, 6], True, [-0.1, -0.2], [3, 4])
    sample.append([7], False)
    sample.append([8], True, [-0.3])  # an engine that counts no versions
    assert sample.versions == [3, 4, -1, -1]
    trajectory = Trajectory([sample])
    again = Trajectory.from_dict(trajectory.to_dict())
    assert again.samples[0].versions == [3, 4, -1, -1]
    old = Sample([1], [5, 6], [1, 1], [0.0, 0.0])  # written before versions were recorded
    old.append([9], True, [-0.5], [2])
    assert old.versions == []  # not recorded: no partial list that would misalign


def test_policy_versions_give_each_token_its_staleness_by_hand():
    engine = SimpleNamespace(weights_version=0)
    versions = PolicyVersions(engine, step=0)
    engine.weights_version = 1  # the warm-up's sync: still step 0's weights
    versions.loaded(0)
    engine.weights_version = 2
    versions.loaded(1)
    engine.weights_version = 3
    versions.loaded(2)

    def episode(token_versions: list[int]) -> Trajectory:
        sample = Sample([0])
        for v in token_versions:
            sample.append([1], v >= 0, [0.0], [v] if v >= 0 else None)
        return Trajectory([sample])

    # learned at step 2: tokens of versions 1 (step 0), 2 (step 1), 3 (step 2)
    mixed = episode([1, 1, -1, 2, 3])  # -1: an observation token, not counted
    alone = episode([3, 3])
    unknown = episode([])  # nothing recorded: the rollouts' starting step stands in
    figures = versions.step_figures([mixed, alone, unknown], 2, 1, lambda mine: mine)
    ages = [2, 2, 1, 0, 0, 0, 1]  # mixed's tokens, alone's, unknown's stand-in
    assert figures["token_staleness"] == pytest.approx(sum(ages) / len(ages))
    assert figures["token_staleness_max"] == 2.0
    assert figures["mixed_policy_episodes"] == pytest.approx(1 / 3)
    assert mixed.metrics == {"staleness": 2, "policy_versions": 3}
    assert alone.metrics == {"staleness": 0, "policy_versions": 1}
    assert unknown.metrics == {"staleness": 1, "policy_versions": 1}


def test_pipelined_training_on_a_scripted_engine_records_each_token_s_weights(tmp_path):
    """A 3-turn game with updates landing between turns: episodes that a weight update split
    are counted, every token's staleness stays within the bound, and the samples say so."""
    tokenizer = tiny_tokenizer()
    words = ["slate", "moist", "pound", "crane", "light"]
    engine = ScriptedEngine([ids(tokenizer, GUESS.format(word=w)) for w in words])
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=4,
        prompts_per_step=2,
        num_generations=2,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=3, max_new_tokens=60, max_episode_tokens=400),
        parser="hermes",
        env_reward=False,
        max_staleness=1,
        progress_bar=False,
        save_steps=0,
    )

    def by_position(prompts, completions, trajectories, **_):
        return [float(i) for i in range(len(trajectories))]

    rows = list(toolgym.spec("Wordle-v0").dataset(4, seed=0))
    model = tiny_model(tokenizer, seed=1)
    trainer = GRPOTrainer(
        model, "Wordle-v0", rows, [by_position], args, tokenizer=tokenizer, engine=engine
    )
    history = trainer.train()
    assert len(history) == 4 and engine.weights_version == 4
    for metrics in history:
        assert 0 <= metrics["token_staleness"] <= metrics["token_staleness_max"] <= 1
        assert 0 <= metrics["mixed_policy_episodes"] <= 1
    episodes = load_jsonl(tmp_path / "samples.jsonl")
    assert len(episodes) == 16
    for episode in episodes:
        sample = episode.samples[-1]
        sampled = [v for v, m in zip(sample.versions, sample.loss_mask, strict=True) if m]
        assert sampled and all(v >= 0 for v in sampled)
        assert episode.metrics["staleness"] <= 1
        assert episode.metrics["policy_versions"] == len(set(sampled))
