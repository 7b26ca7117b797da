"""Episodes kept in flight (`toolgym.agents.in_flight`): the store, the resume rule, and an
episode that cannot be kept (it plays on unkept, with a warning)."""

from __future__ import annotations

import pickle
import warnings

import pytest

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.agents.in_flight import (
    InFlight,
    InFlightStore,
    resumable_rollout,
    resume_in_flight,
    task_fingerprint,
)
from toolgym.envs.snapshots import NotForkable
from toolgym.testing import tiny_tokenizer


class Heard:
    """A plain class (no `Environment` base): the agent wraps it itself."""

    def reset(self, **row):
        self.heard = []
        self.reward = 0.0

    @toolgym.hook
    def user_turn(self, answer):
        self.heard.append(answer)
        self.reward = float(len(self.heard))
        return "Go on."


class Unpicklable(toolgym.Environment):
    """State that deep-copies (a snapshot) but does not pickle (a file): a lambda."""

    def reset(self, **row):
        self.check = lambda answer: len(answer)
        self.reward = 0.0

    def user_turn(self, answer):
        self.reward += 1.0
        return "Go on."


class Fragile(Heard):
    """Kept like `Heard`; its snapshots do not restore (as an older version's would not)."""

    @toolgym.hook
    def restore_state(self, state):
        raise NotForkable("this snapshot is of another version")


def agent(turns: int = 3) -> Agent:
    tokenizer = tiny_tokenizer()
    reply = tokenizer.encode("x<|im_end|>", add_special_tokens=False)
    return Agent(ScriptedEngine([reply]), tokenizer, limits=AgentLimits(max_turns=turns))


def test_a_plain_class_is_kept_under_its_key(tmp_path):
    store, env = InFlightStore(tmp_path), Heard()
    (trajectory,) = agent().run(
        [env], [{"prompt": "Talk."}], rollout_fn=resumable_rollout(store, {id(env): "k"})
    )
    assert trajectory.status == "max_turns" and trajectory.reward == 3.0
    kept = store.load("k")
    assert kept is not None and kept.turns == 2  # after turn 2, the last before the limit
    assert kept.messages[-1]["content"] == "Talk."


def test_an_episode_whose_state_does_not_pickle_plays_on_unkept(tmp_path):
    store, env = InFlightStore(tmp_path), toolgym.as_environment(Unpicklable())
    with pytest.warns(UserWarning, match="cannot be kept in flight"):
        (trajectory,) = agent().run(
            [env], [{"prompt": "Talk."}], rollout_fn=resumable_rollout(store, {id(env): "k"})
        )
    assert trajectory.status == "max_turns" and trajectory.reward == 3.0
    assert store.kept_keys() == [] and not list(tmp_path.glob("*.part"))


def test_only_kept_episodes_of_the_same_task_go_on(tmp_path):
    store = InFlightStore(tmp_path)
    for key, task in [("a", task_fingerprint({"x": 1}, 0)), ("b", task_fingerprint({"x": 1}, 1))]:
        store.save(key, InFlight(None, None, [], 1, {"task": task}))  # type: ignore[arg-type]
    wanted = task_fingerprint({"x": 1}, 0)
    kept = resume_in_flight(store, ["a", "b", "c"], lambda _, ep: ep.meta["task"] == wanted)
    assert list(kept) == ["a"] and store.kept_keys() == ["a"]  # b was another seed's


def test_the_store_refuses_bad_keys_and_forgets_files_it_cannot_read(tmp_path):
    store = InFlightStore(tmp_path)
    for key in ("../x", "a/b", "", "x" * 200):
        with pytest.raises(ValueError, match="in-flight key"):
            store.load(key)
    (tmp_path / "k.pkl").write_bytes(pickle.dumps({"not": "an episode"}))
    with pytest.raises(TypeError, match="does not hold an in-flight episode"):
        store.load("k")
    (tmp_path / "cut.pkl").write_bytes(b"\x80\x05half")
    (tmp_path / "not a key!.pkl").write_bytes(b"")
    assert store.kept_keys() == ["cut", "k"]  # other names are not episodes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.prune(lambda _, __: True)
    assert len(caught) == 2 and store.kept_keys() == []  # both forgotten, each said


def test_a_folder_others_own_or_may_write_is_refused(tmp_path):
    made = InFlightStore(tmp_path / "made")
    assert made.folder.stat().st_mode & 0o077 == 0  # its owner's only
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by it alone"):
        InFlightStore(shared)


def test_a_kept_episode_that_does_not_restore_is_played_from_its_start(tmp_path):
    store, env = InFlightStore(tmp_path), Fragile()
    agent().run([env], [{"prompt": "Talk."}], rollout_fn=resumable_rollout(store, {id(env): "k"}))
    kept = resume_in_flight(store, ["k"], lambda _, __: True)
    assert list(kept) == ["k"]
    again = Fragile()
    with pytest.warns(UserWarning, match="did not restore .*another version.*from its start"):
        (trajectory,) = agent().run(
            [again],
            [{"prompt": "Talk."}],
            rollout_fn=resumable_rollout(store, {id(again): "k"}, kept),
        )
    assert trajectory.status == "max_turns" and trajectory.reward == 3.0  # all three turns again
    assert "resumed_at_turn" not in trajectory.metrics
