"""Episodes in flight, kept between turns so that a restarted run goes on from them.

An episode that a run stops in the middle of (a killed process, a lost machine) is usually
played again from its start, or dropped. With snapshots it need not be: after each turn,
`resumable_rollout` writes the episode's state to an `InFlightStore`, one file per episode:

- the environment's and the episode's state (`Stepper.snapshot`; a sandboxed environment's
  is its worker's own pickle, which the host keeps opaque),
- the rollout's context (`RolloutContext.context`: the trajectory with its exact tokens,
  masks and logprobs, the model's view of the conversation, the counters),
- the episode's first messages, the number of turns played, and the caller's `meta` (e.g. a
  fingerprint of the task, so that a kept episode never goes on as another task's).

After a restart, `resume_in_flight` reads the kept episodes of the keys about to be played
(those the caller's `accept` refuses are forgotten), and `resumable_rollout` plays each of them
on from its next turn: the environment, reset for the row as usual, restores the kept
snapshot, and the kept trajectory goes on (its earlier turns are not generated again;
`resumed_at_turn` in the episode's metrics says where it went on). The caller discards an
episode's file once its finished trajectory is recorded.

The files are pickles, read back only from the folder the run names: that folder is trusted
as a checkpoint folder is (docs/security.md, "Episodes kept in flight"); one that another
account owns or may write is refused. An episode whose state cannot be kept (`NotForkable`, a
state that does not pickle, a full disk) plays on unkept, with one warning.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pickle
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.agents.custom import EpisodeContext, EpisodeEnd, RolloutContext, RolloutFn
from toolgym.agents.rollout_functions import chat_rollout, chat_turns, inline_rollout
from toolgym.agents.trajectory import Trajectory
from toolgym.envs.snapshots import Snapshot

_KEY = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(frozen=True)
class InFlight:
    """One unfinished episode, stopped between turns."""

    snapshot: Snapshot
    """The environment's and the episode's state (`Stepper.snapshot`)."""
    context: EpisodeContext
    """The rollout's state: trajectory, the model's view, counters."""
    messages: list[dict[str, Any]]
    """The episode's first messages (the row's prompt and the reset's observation)."""
    turns: int
    """Turns played; the next to generate has this index."""
    meta: dict[str, Any] = field(default_factory=dict)
    """What the caller keeps beside it (e.g. which weights sampled it, which task it plays)."""


class InFlightStore:
    """A folder of in-flight episodes, one file per key (`[A-Za-z0-9_.-]`, e.g. "3-1").

    Each `save` replaces the key's file whole (written beside it, flushed to disk, then
    renamed), so a run killed while writing leaves the previous turn's state, never half a
    file. The folder is made readable by its owner only; an existing one that another account
    owns, or that others may write, is refused (`PermissionError`): its files are unpickled.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # as trusted as checkpoints
        status = self.folder.stat()
        if status.st_uid != os.getuid() or status.st_mode & 0o022:
            raise PermissionError(
                f"{self.folder}: an in-flight folder must be this account's and writable by "
                "it alone (its files are unpickled); remove it or choose another place"
            )

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"an in-flight key is letters, digits, '_', '.', '-': {key!r}")
        return self.folder / f"{key}.pkl"

    def save(self, key: str, episode: InFlight) -> None:
        """Keep `episode` as `key`'s (replacing what was kept)."""
        path = self._path(key)
        handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".part")
        try:
            with os.fdopen(handle, "wb") as file:
                pickle.dump(episode, file, protocol=pickle.HIGHEST_PROTOCOL)
                file.flush()
                os.fsync(file.fileno())  # a machine that dies leaves the file whole too
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def load(self, key: str) -> InFlight | None:
        """What was kept for `key`, or None. Raises for a file that does not hold one."""
        path = self._path(key)
        if not path.exists():
            return None
        with path.open("rb") as file:
            episode = pickle.load(file)  # the run's own folder (see the module's doc)
        if not isinstance(episode, InFlight):
            raise TypeError(f"{path} does not hold an in-flight episode")
        return episode

    def recall(self, key: str) -> InFlight | None:
        """Like `load`, but a file that cannot be read back (damaged, of another kind, of a
        class that moved) is forgotten with a warning, and None returned: the episode is
        then played from its start."""
        try:
            return self.load(key)
        except Exception as error:
            warnings.warn(
                f"the in-flight episode {key!r} cannot be read back ({type(error).__name__}: "
                f"{error}); it is forgotten and played again",
                stacklevel=2,
            )
            self.discard(key)
            return None

    def discard(self, key: str) -> None:
        """Forget `key`'s episode (it ended and was recorded)."""
        self._path(key).unlink(missing_ok=True)

    def kept_keys(self) -> list[str]:
        """The keys of the episodes kept, sorted (files of other names are not episodes)."""
        return sorted(p.stem for p in self.folder.glob("*.pkl") if _KEY.fullmatch(p.stem))

    def prune(self, keep: Callable[[str, InFlight], bool]) -> None:
        """Forget every episode for which `keep(key, episode)` is false (and any that cannot
        be read back)."""
        for key in self.kept_keys():
            episode = self.recall(key)
            if episode is not None and not keep(key, episode):
                self.discard(key)

    def clear(self) -> None:
        """Forget every episode (a new run in the same folder), and any file a killed run
        was writing."""
        for path in [*self.folder.glob("*.pkl"), *self.folder.glob("*.part")]:
            path.unlink()


def task_fingerprint(*parts: Any) -> str:
    """A short hash of what makes an episode's task (its row, seed, environment, ...), kept
    in `InFlight.meta` so that a kept episode goes on only as the same task."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def resume_in_flight(
    store: InFlightStore,
    keys: Sequence[str],
    accept: Callable[[str, InFlight], bool] | None = None,
) -> dict[str, InFlight]:
    """The kept episodes among `keys` that go on (for `resumable_rollout`); one that
    `accept(key, kept)` refuses, or that cannot be read back, is forgotten."""
    kept = {}
    for key in keys:
        episode = store.recall(key)
        if episode is None:
            continue
        if accept is not None and not accept(key, episode):
            store.discard(key)
            continue
        kept[key] = episode
    return kept


def resumable_rollout(
    store: InFlightStore,
    keys: Mapping[int, str],
    kept: Mapping[str, InFlight] | None = None,
    meta: Callable[[str], dict[str, Any]] | None = None,
) -> RolloutFn:
    """The chat tool-call loop (`chat_rollout`), keeping each episode in `store` after every
    turn under its key (`keys`: `id(env)` of the environment as given, or of the object a
    stepped environment wraps, to key) with `meta(key)` beside it; an episode with a `kept`
    state goes on from it."""
    said: list[str] = []
    kept = kept or {}

    async def play(ctx: RolloutContext, env: Any) -> Trajectory:
        if getattr(env, "inline_markers", ()):
            _warn_once(said, "the inline protocol is not kept between turns")
            return await inline_rollout(ctx, env)
        key = keys.get(id(env), keys.get(id(getattr(env, "unwrapped", None)), ""))
        if not key:
            _warn_once(said, "an environment without a key (played unkept)")
            return await chat_rollout(ctx, env)
        episode = kept.get(key)
        if episode is not None:  # reset for its row as usual, then back to where it was
            try:
                await asyncio.to_thread(env.restore, episode.snapshot)
            except Exception as error:  # NotForkable, an older version's snapshot, ...
                why = f"a kept episode did not restore ({error}); played from its start"
                warnings.warn(why, stacklevel=2)
                episode = None  # a failed restore leaves the environment as it was reset
        if episode is not None:
            trajectory, turn, first = _resumed(ctx, episode)
        else:
            trajectory, turn = ctx.start(tools=ctx.tools), 0
            first = [dict(message) for message in ctx.messages]
        keeping = True
        while turn < ctx.limits.max_turns:
            if await chat_turns(ctx, trajectory, turn, turn + 1):
                return trajectory
            turn += 1
            if keeping and turn < ctx.limits.max_turns:
                extra = meta(key) if meta is not None else {}
                try:
                    snapshot = await asyncio.to_thread(env.snapshot)
                    state = InFlight(snapshot, ctx.context(), first, turn, extra)
                    await asyncio.to_thread(store.save, key, state)
                except Exception as error:  # not copyable or picklable, a full disk...
                    keeping = False
                    _warn_once(said, f"{type(error).__name__}: {error}")
        raise EpisodeEnd("max_turns")

    return play


def _resumed(ctx: RolloutContext, episode: InFlight) -> tuple[Trajectory, int, list[Any]]:
    """The kept trajectory as this episode's, the turn to go on from, its first messages."""
    trajectory = ctx.resume(episode.context)
    for sample in trajectory.samples:  # another engine's weight counts: unknown here
        sample.versions = [-1] * len(sample.versions)
    ctx.metrics["resumed_at_turn"] = float(episode.turns)
    return trajectory, episode.turns, [dict(message) for message in episode.messages]


def _warn_once(said: list[str], reason: str) -> None:
    if not said:
        said.append(reason)
        warnings.warn(
            f"an episode cannot be kept in flight (it will be played again after a restart): "
            f"{reason}",
            stacklevel=2,
        )
