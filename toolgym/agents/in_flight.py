"""Episodes in flight, kept between turns so that a restarted run goes on from them.

An episode that a run stops in the middle of (a killed process, a lost machine) is usually
played again from its start, or dropped. With snapshots it need not be: after each turn,
`resumable_rollout` writes the episode's state to an `InFlightStore`, one file per episode:

- the environment's and the episode's state (`Stepper.snapshot`; a sandboxed environment's
  is its worker's own pickle, which the host keeps opaque),
- the rollout's context (`RolloutContext.context`: the trajectory with its exact tokens,
  masks and logprobs, the model's view of the conversation, the counters),
- the episode's first messages and the number of turns played.

After a restart, `resume_in_flight` wraps the environment of each episode that has a file in
a `Resumed` stepper: its `reset` restores the snapshot instead of starting a new episode, and
`resumable_rollout` goes on from the next turn on the kept trajectory (its earlier turns are
not generated again; `resumed_at_turn` in the episode's metrics says where it went on). The
caller discards an episode's file once its finished trajectory is recorded.

The files are pickles, read back only from the folder the run names: that folder is trusted
as a checkpoint folder is (docs/security.md, "Episodes kept in flight"). Environments whose
state cannot be copied (`NotForkable`) play on without being kept, with one warning.
"""

from __future__ import annotations

import asyncio
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
from toolgym.agents.rollout_functions import chat_turns, inline_rollout
from toolgym.agents.trajectory import Trajectory
from toolgym.envs.snapshots import NotForkable, Snapshot
from toolgym.envs.stepping import Stepper

Row = dict[str, Any]

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
    """What the caller keeps beside it (e.g. which weights sampled it, which row it plays)."""


class InFlightStore:
    """A folder of in-flight episodes, one file per key (`[A-Za-z0-9_.-]`, e.g. "3-1").

    Each `save` replaces the key's file whole (written beside it, then renamed), so a run
    killed while writing leaves the previous turn's state, never half a file.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # as trusted as checkpoints

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
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def load(self, key: str) -> InFlight | None:
        """What was kept for `key`, or None."""
        path = self._path(key)
        if not path.exists():
            return None
        with path.open("rb") as file:
            episode = pickle.load(file)  # the run's own folder (see the module's doc)
        if not isinstance(episode, InFlight):
            raise TypeError(f"{path} does not hold an in-flight episode")
        return episode

    def discard(self, key: str) -> None:
        """Forget `key`'s episode (it ended and was recorded)."""
        self._path(key).unlink(missing_ok=True)

    def kept_keys(self) -> list[str]:
        """The keys of the episodes kept, sorted."""
        return sorted(path.stem for path in self.folder.glob("*.pkl"))

    def prune(self, keep: Callable[[str, InFlight], bool]) -> None:
        """Forget every episode for which `keep(key, episode)` is false."""
        for key in self.kept_keys():
            episode = self.load(key)
            if episode is None or not keep(key, episode):
                self.discard(key)

    def clear(self) -> None:
        """Forget every episode (a new run in the same folder), and any file a killed run
        was writing."""
        for path in [*self.folder.glob("*.pkl"), *self.folder.glob("*.part")]:
            path.unlink()


class Resumed(Stepper):
    """An environment that goes on from a kept episode: `reset` restores its snapshot."""

    def __init__(self, env: Stepper, kept: InFlight) -> None:
        super().__init__(env.executor)
        self.original, self.kept = env, kept

    def reset(self, seed: int | None = None, **row: Any) -> str | None:
        """The kept episode's state, not a new episode (its first messages are the row's)."""
        self.restore(self.kept.snapshot)
        return None

    def close(self) -> None:
        self.original.close()


def resume_in_flight(
    store: InFlightStore,
    envs: Sequence[Any],
    rows: Sequence[Row],
    keys: Sequence[str],
    accept: Callable[[str, InFlight], bool] | None = None,
) -> tuple[list[Any], list[Row]]:
    """The environments and rows to play: the episode of each key with a kept state goes on
    from it (a `Resumed` environment, whose row's prompt is the kept first messages), unless
    `accept(key, kept)` refuses it (then it is forgotten); the others start as given."""
    played_envs, played_rows = list(envs), [dict(row) for row in rows]
    for i, key in enumerate(keys):
        kept = store.load(key)
        if kept is None:
            continue
        if accept is not None and not accept(key, kept):
            store.discard(key)
            continue
        if not isinstance(envs[i], Stepper):
            raise TypeError("a kept episode resumes on a stepped environment (toolgym.make)")
        played_envs[i] = Resumed(envs[i], kept)
        played_rows[i]["prompt"] = [dict(message) for message in kept.messages]
    return played_envs, played_rows


def resumable_rollout(
    store: InFlightStore,
    keys: Mapping[int, str],
    meta: Callable[[Any], dict[str, Any]] | None = None,
) -> RolloutFn:
    """The chat tool-call loop (`chat_rollout`), keeping each episode in `store` after every
    turn under its key (`keys`: `id(env)` to key) with `meta(env)` beside it, and going on
    from the kept state where the environment is `Resumed`."""
    unkeepable: list[str] = []

    async def play(ctx: RolloutContext, env: Any) -> Trajectory:
        if getattr(env, "inline_markers", ()):
            _warn_once(unkeepable, "the inline protocol is not kept between turns")
            return await inline_rollout(ctx, env)
        key = keys[id(env)]
        if isinstance(env, Resumed):
            trajectory, turn = ctx.resume(env.kept.context), env.kept.turns
            ctx.metrics["resumed_at_turn"] = float(turn)
        else:
            trajectory, turn = ctx.start(tools=ctx.tools), 0
        first = [dict(message) for message in ctx.messages]
        keeping = isinstance(env, Stepper)
        while turn < ctx.limits.max_turns:
            if await chat_turns(ctx, trajectory, turn, turn + 1):
                return trajectory
            turn += 1
            if keeping and turn < ctx.limits.max_turns:
                try:
                    snapshot = await asyncio.to_thread(env.snapshot)
                except NotForkable as error:
                    keeping = False
                    _warn_once(unkeepable, str(error))
                    continue
                extra = meta(env) if meta is not None else {}
                kept = InFlight(snapshot, ctx.context(), first, turn, extra)
                await asyncio.to_thread(store.save, key, kept)
        raise EpisodeEnd("max_turns")

    return play


def _warn_once(said: list[str], reason: str) -> None:
    if not said:
        said.append(reason)
        warnings.warn(
            f"an episode cannot be kept in flight (it will be played again after a restart): "
            f"{reason}",
            stacklevel=2,
        )
