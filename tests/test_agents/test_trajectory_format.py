"""Trajectory files: one shape (a list of samples, a reward breakdown), and files written
before it still load."""

from __future__ import annotations

import json
from pathlib import Path

from toolgym.agents.trajectory import Sample, Trajectory, load_jsonl, save_jsonl

V1 = Path(__file__).parents[1] / "data" / "trajectories_v1.jsonl"
"""Written by toolgym before `Trajectory.samples` (flat fields; `turns` for a per-turn
episode): a scripted Wordle win played as one sequence (reward 1.0, step 1), then the same
game played one sample per turn (reward None: "no reward", step 2)."""


def test_files_written_before_samples_still_load():
    whole, per_turn = load_jsonl(V1)
    assert len(whole.samples) == 1
    (sample,) = whole.samples
    assert len(sample.completion_ids) == len(sample.loss_mask) == len(sample.logprobs) == 117
    assert 0 in sample.loss_mask and whole.model_tokens == 62  # observation tokens masked
    assert whole.reward == 1.0 and whole.status == "env_done" and whole.metrics["step"] == 1
    assert whole.reward_sources == {}  # the old `rewards`, never written
    assert len(per_turn.samples) == 2 and per_turn.reward is None
    for turn in per_turn.samples:  # each turn: its own prompt, a completion all sampled
        assert turn.loss_mask == [1] * len(turn.completion_ids) == [1] * len(turn.logprobs)
    first, second = per_turn.samples
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    assert len(second.prompt_ids) > len(first.prompt_ids) + len(first.completion_ids) - 1
    assert per_turn.model_tokens == sum(len(s.completion_ids) for s in per_turn.samples)
    assert per_turn.completion_ids == second.completion_ids  # the flat names: the last sample
    assert [m["role"] for m in per_turn.messages] == ["user"] + ["assistant", "tool"] * 2


def test_old_files_round_trip_in_the_new_shape(tmp_path):
    old = load_jsonl(V1)
    save_jsonl(old, tmp_path / "new.jsonl")
    assert load_jsonl(tmp_path / "new.jsonl") == old
    data = json.loads((tmp_path / "new.jsonl").read_text().splitlines()[1])
    assert len(data["samples"]) == 2 and "turns" not in data and "completion_ids" not in data
    assert data["reward"] is None and data["reward_sources"] == {}


def test_one_shape_for_one_sequence_and_per_turn():
    trajectory = Trajectory([Sample([1, 2])])
    trajectory.append([3, 4], sampled=True, logprobs=[-0.5, -0.5])
    trajectory.append([5], sampled=False)
    # no weights versions given: -1 per token (an engine that counts none; observations)
    versions = [-1, -1, -1]
    expected = Sample([1, 2], [3, 4, 5], [1, 1, 0], [-0.5, -0.5, 0.0], versions=versions)
    assert trajectory.samples == [expected]
    assert (trajectory.model_tokens, trajectory.observation_tokens) == (2, 1)
    trajectory.samples.append(Sample([1, 2, 3, 4, 5, 6], parent=0))  # the next turn's prompt
    trajectory.append([7], sampled=True, logprobs=[-1.0])
    assert trajectory.prompt_ids == [1, 2, 3, 4, 5, 6] and trajectory.loss_mask == [1]
    assert (trajectory.model_tokens, trajectory.observation_tokens) == (3, 2)
    # a compacted continuation: its prompt is shorter than its parent's sequence, and adds
    # no observation token; what it samples and observes counts as in any sample
    trajectory.samples.append(Sample([1, 2, 9], parent=1))
    trajectory.append([8], sampled=True, logprobs=[-1.0])
    trajectory.append([10, 11], sampled=False)
    assert (trajectory.model_tokens, trajectory.observation_tokens) == (4, 4)
    assert Trajectory().samples == [Sample([])]
