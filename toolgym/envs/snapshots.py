"""Snapshots and forks of a live environment (in this process or in a sandbox worker).

`Stepper.snapshot()` returns a `Snapshot`: the environment's state and the executor's flags,
and the episode's (`EpisodeState`: turns, answer, failure, reward read); `restore(snap)`
goes back to it; `fork(n)` gives n independent live copies, each a `Stepper` of its own. A
group can then start from one mid-episode state and differ only in what follows.

What is copied of the environment:
- by default, a deep copy of its attributes (its `rng` included). An attribute that cannot be
  copied (an open file, a socket, a thread, a lock) is named in a `NotForkable` error;
- an environment that knows better defines `snapshot_state()` (what matters, copied) and
  `restore_state(state)` (put it back; it is handed a copy of its own). A fork then starts
  as a shallow copy of the instance with that state restored: what the hooks leave out (a
  client, a file it only appends to) is shared by the copies.

A sandboxed environment is copied by its worker (`toolgym.sandbox.remote.RemoteExecutor`):
the worker pickles the same state, the host keeps it opaque (it never unpickles what the
model's code could have shaped), and a fork is a fresh sandbox with the state restored in
it (and the files of the worker's private /tmp). MCP and OpenEnv environments are not
copied: their servers offer no snapshot (`NotForkable`). The global `random` module's state
is not part of a snapshot (an environment should draw from its `rng`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


class NotForkable(TypeError):
    """This environment (or where it lives) cannot be snapshotted or forked; says why."""


@dataclass(frozen=True)
class Snapshot:
    """An opaque record of one live episode (picklable where the environment's state is).

    Attributes:
        target: The environment's class, `module.QualName` (a snapshot restores only into an
            instance of the same class).
        environment: What the executor keeps of the episode: the environment's state (its
            hooks' value, or its attributes copied; a sandbox worker's pickle of it) and the
            executor's own flags.
        episode: The episode's state (`toolgym.envs.episode_state.EpisodeState`, a copy).
    """

    target: str
    environment: Any
    episode: Any


def class_name(cls: type) -> str:
    """`module.QualName`: which class a snapshot may restore into."""
    return f"{cls.__module__}.{cls.__qualname__}"


def state_of(instance: object) -> Any:
    """A copy of `instance`'s state: its `snapshot_state()`, or its attributes deep-copied."""
    hook = getattr(instance, "snapshot_state", None)
    if callable(hook) and not _is_default(instance, "snapshot_state"):
        return copy.deepcopy(hook())
    return _copied_attributes(instance)


def restore_into(instance: object, state: Any) -> None:
    """Put a copy of `state` (from `state_of`) back into `instance`."""
    hook = getattr(instance, "restore_state", None)
    if callable(hook) and not _is_default(instance, "restore_state"):
        hook(copy.deepcopy(state))
        return
    attributes = vars(instance)
    attributes.clear()
    attributes.update(copy.deepcopy(state))


def forked(instance: object, n: int = 1) -> list[object]:
    """`n` independent copies of `instance` (see the module docstring); an environment's
    `snapshot_state()` is taken once for all of them."""
    hooked = callable(getattr(instance, "snapshot_state", None)) and not _is_default(
        instance, "snapshot_state"
    )
    state = state_of(instance) if hooked else None
    clones: list[object] = []
    try:
        for _ in range(n):
            clone = copy.copy(instance)
            if hooked:
                restore_into(clone, state)
            else:
                vars(clone).clear()
                vars(clone).update(_copied_attributes(instance))
            clones.append(clone)
    except BaseException:
        for made in clones:  # e.g. a REPL's session: stopped, not left to the collector
            close = getattr(made, "close", None)
            if callable(close):
                close()
        raise
    return clones


def _copied_attributes(instance: object) -> dict[str, Any]:
    try:
        attributes = vars(instance)
    except TypeError:
        raise NotForkable(
            f"{type(instance).__name__} keeps no attributes to copy (__slots__ or a builtin): "
            "define snapshot_state() and restore_state()"
        ) from None
    copied = {}
    for name, value in attributes.items():
        try:
            copied[name] = copy.deepcopy(value)
        except Exception as error:
            raise NotForkable(
                f"{type(instance).__name__}.{name} ({type(value).__name__}) cannot be copied "
                f"({type(error).__name__}: {error}): define snapshot_state() and "
                "restore_state() to copy what matters (what they leave out is shared by forks)"
            ) from None
    return copied


def _is_default(instance: object, name: str) -> bool:
    """Whether `name` is `Environment`'s own default (no hook of the class's)."""
    from toolgym.envs.core import Environment

    method = getattr(type(instance), name, None)
    return method is getattr(Environment, name, None)
