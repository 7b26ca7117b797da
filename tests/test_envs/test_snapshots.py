"""Snapshots and forks of a live environment in this process (issue 46 items 1 and 2, the
in-process part): `snapshot()` / `restore()` / `fork(n)` on the stepping layer, the same on
`make(...)` and `as_environment(...)`, the environment's own hooks, a clear error naming what
cannot be copied, and a clear refusal where the environment lives elsewhere."""

from __future__ import annotations

import pickle
import threading

import pytest

import toolgym
from toolgym import ToolCall
from toolgym.envs.snapshots import NotForkable


def guess(word: str) -> ToolCall:
    return ToolCall("guess", {"word": word})


def words(env) -> list[str]:
    return [word for word, _ in env.unwrapped.history]


def wordle():
    env = toolgym.make("Wordle-v0")
    env.reset(seed=3, answer="crane")
    return env


def test_restore_goes_back_to_the_snapshot_mid_episode():
    env = wordle()
    env.step(guess("slate"))
    snap = env.snapshot()
    first = env.step(guess("moist")).messages[0]["content"]
    won = env.step(guess("crane"))
    assert env.done and won.info.get("ended") is None and env.turn == 3
    env.restore(snap)
    assert not env.done and env.turn == 1 and not env.answered
    assert env.step(guess("moist")).messages[0]["content"] == first  # the same game, again
    assert words(env) == ["slate", "moist"]


def test_forks_are_independent_live_copies():
    env = wordle()
    env.step(guess("slate"))
    left, right = env.fork(2)
    left.step(guess("crane"))
    assert left.done and not right.done and not env.done
    assert words(right) == ["slate"] and words(env) == ["slate"]
    assert right.turn == env.turn == 1 and left.turn == 2
    same = [e.step(guess("moist")).messages[0]["content"] for e in (right, env)]
    assert same[0] == same[1]
    assert right.unwrapped.rng is not env.unwrapped.rng  # its own generator, in the same state


def test_a_snapshot_pickles_and_restores_another_instance_of_the_class():
    env = wordle()
    env.step(guess("slate"))
    snap = pickle.loads(pickle.dumps(env.snapshot()))
    other = toolgym.make("Wordle-v0")
    other.reset(seed=9, answer="pious")
    other.restore(snap)
    assert other.unwrapped.answer == "crane" and words(other) == ["slate"]
    with pytest.raises(ValueError, match="cannot restore"):
        toolgym.make("GuessNumber-v0").restore(snap)


class Counter:
    """A plain (TRL-shaped) class."""

    def reset(self, **row):
        self.count = 0

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: How much.
        """
        self.count += step
        return self.count


def test_a_plain_class_forks_as_an_environment_does():
    env = toolgym.as_environment(Counter())
    env.reset()
    env.step(ToolCall("increment", {"step": 2}))
    (copy,) = env.fork()
    copy.step(ToolCall("increment", {"step": 5}))
    assert (env.unwrapped.count, copy.unwrapped.count) == (2, 7)


class Logged(toolgym.Environment):
    """An environment with a lock, which no copy can take."""

    def reset(self, **row) -> str:
        self.lock, self.moves = threading.Lock(), []
        return "go"

    def move(self, to: str) -> str:
        """Move.

        Args:
            to: Where.
        """
        self.moves.append(to)
        return "ok"


class LoggedWithHooks(Logged):
    """The same, saying what matters: the moves; the lock is shared by forks."""

    def snapshot_state(self):
        return list(self.moves)

    def restore_state(self, state) -> None:
        self.moves = state


def test_what_cannot_be_copied_is_named_and_hooks_copy_what_matters():
    env = toolgym.as_environment(Logged())
    env.reset()
    with pytest.raises(NotForkable, match=r"Logged\.lock \(lock\) cannot be copied"):
        env.snapshot()
    hooked = toolgym.as_environment(LoggedWithHooks())
    hooked.reset()
    hooked.step(ToolCall("move", {"to": "north"}))
    snap = hooked.snapshot()
    (copy,) = hooked.fork()
    copy.step(ToolCall("move", {"to": "south"}))
    assert hooked.unwrapped.moves == ["north"] and copy.unwrapped.moves == ["north", "south"]
    assert copy.unwrapped.lock is hooked.unwrapped.lock  # left out of the state: shared
    hooked.step(ToolCall("move", {"to": "east"}))
    hooked.restore(snap)
    assert hooked.unwrapped.moves == ["north"]


def test_snapshot_before_reset_and_fork_of_zero_are_refused():
    env = toolgym.make("Wordle-v0")
    with pytest.raises(RuntimeError, match="call reset"):
        env.snapshot()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="n >= 1"):
        env.fork(0)


def test_a_server_s_environment_refuses_with_the_reason():
    """MCP and OpenEnv servers offer no snapshot (sandboxed environments do fork:
    tests/test_sandbox/test_sandbox_snapshots.py)."""
    from toolgym.adapters.mcp import MCPExecutor
    from toolgym.adapters.openenv import OpenEnvExecutor

    with pytest.raises(NotForkable, match="MCP server offers no snapshot"):
        MCPExecutor.__new__(MCPExecutor).fork()
    with pytest.raises(NotForkable, match="OpenEnv server offers no snapshot"):
        OpenEnvExecutor.__new__(OpenEnvExecutor).snapshot()
