"""Tree rollouts: a group's first turns played once, then the episode forked.

With `GRPOConfig.branch_at_turn = K`, each group of `num_generations` episodes is played as
trees of `tree_size` members (default: one tree per group). Each tree's root episode plays
turns 1..K; the environment is then forked (`Stepper.fork`) and the episode's context copied
(`RolloutContext.context`), and each of the tree's members goes on from there on its own copy
(`RolloutContext.resume`). The siblings share the first K turns token for token (the engine's
prefix cache holds them once) and differ only in what follows, so their rewards compare what
they did after the branch point. Each member's trajectory records how many tokens of each
sample it shares (`Trajectory.shared`).

Training: with one tree per group, the members are the group, each other's baseline, as in
GRPO, and the shared turns carry a loss mask of 0: within the tree the members' advantages
sum to zero, so the prefix they share has nothing to learn from them. With several trees per
group the shared turns keep their mask, and `toolgym.algorithms.tree_credit` credits them
with their tree's mean against the other trees'.

Both built-in protocols branch. In the chat protocol a turn is an assistant message and
what followed it; in the inline protocol (an environment with `inline_markers`) a turn is
one generation, up to a marker, and its observation: the members go on writing the root's
one assistant turn from where it stopped (a REPL forked after its K-th line). A root that
ends before turn K (it answered, the environment ended, a failure) cannot branch: its tree's
rows are played as independent episodes from the start instead. A `rollout_fn` of one's own is
refused when the trainer is built.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolgym.agents.custom import EpisodeContext, EpisodeEnd, RolloutContext
from toolgym.agents.rollout_functions import (
    add_inline_message,
    chat_rollout,
    chat_turns,
    inline_markers,
    inline_rollout,
    inline_turns,
)
from toolgym.agents.trajectory import Trajectory
from toolgym.envs.stepping import Stepper

Row = dict[str, Any]


@dataclass
class _Paused:
    """A root stopped at the branch point: its first messages and its context."""

    messages: list[dict[str, Any]]
    context: EpisodeContext
    turn_start: int
    """Where the open assistant turn's tokens start in the completion (the inline protocol:
    the members' message is the whole turn, the root's part included)."""


class Branch(Stepper):
    """One member of a tree: a fork of the root's environment whose `reset` keeps the state
    it was forked with (the episode goes on from the branch point)."""

    def __init__(
        self, forked: Stepper, paused: _Paused, turn: int, train_shared: bool = False
    ) -> None:
        super().__init__(forked.executor)
        self.state, self.forked = forked.state, forked
        self.paused, self.branch_turn = paused, turn
        self.train_shared = train_shared
        """Whether the member's shared turns keep their loss mask (several trees per group)."""

    def reset(self, seed: int | None = None, **row: Any) -> str | None:
        """Nothing: the episode goes on from the fork (its first messages are the row's)."""
        return None

    def close(self) -> None:
        self.forked.close()


def play_trees(
    agent: Any,
    envs: Sequence[Stepper],
    rows: Sequence[Row],
    seeds: Sequence[int | None],
    group: int,
    at_turn: int,
    train_shared: bool = False,
) -> tuple[list[Trajectory], list[Any]]:
    """The episodes of `rows` (trees of `group` consecutive rows, each with its environment
    in `envs`), each tree branching after `at_turn` turns; their trajectories in order, and
    the environments that played them (forks replace the tree's own, which the caller
    closes; the caller closes the forks too). `train_shared`: the members' shared turns keep
    their loss mask (several trees per group; else it is 0)."""
    if len(envs) % group or len(envs) != len(rows) or len(rows) != len(seeds):
        raise ValueError("a tree rollout needs whole trees: one environment and seed per row")
    if not all(isinstance(env, Stepper) for env in envs):
        raise TypeError("a tree rollout forks stepped environments (toolgym.make, as_environment)")
    paused: dict[int, _Paused] = {}
    roots = list(range(0, len(envs), group))
    agent.run(
        [envs[i] for i in roots],
        [rows[i] for i in roots],
        [seeds[i] for i in roots],
        rollout_fn=functools.partial(_until_branch, at_turn=at_turn, paused=paused),
    )
    played: list[Any] = list(envs)
    try:
        for root in roots:
            state = paused.get(id(envs[root]))
            if state is None or envs[root].done:
                continue  # the group plays from the start, on its own environments
            copies = envs[root].fork(group)
            played[root : root + group] = [Branch(c, state, at_turn, train_shared) for c in copies]
        trajectories = agent.run(
            played,
            [_branch_row(row, env) for row, env in zip(rows, played, strict=True)],
            list(seeds),
            rollout_fn=_tree_member,
        )
    except BaseException:
        for env in played:
            if isinstance(env, Branch):
                env.close()
        raise
    return trajectories, played


async def _until_branch(
    ctx: RolloutContext, env: Any, at_turn: int, paused: dict[int, _Paused]
) -> Trajectory:
    """A root's rollout: its first `at_turn` turns, then it stops, its state kept in `paused`
    (by its environment's id); a root that ends before then is not kept (no tree)."""
    markers = inline_markers(env)
    if markers:
        ctx.tools = []  # inline episodes call no tools
    trajectory = ctx.start(tools=ctx.tools)
    start = len(trajectory.completion_ids)
    if markers:
        ended = await inline_turns(ctx, trajectory, markers, at_turn)
    else:
        ended = await chat_turns(ctx, trajectory, 0, at_turn)
    if ended:
        return trajectory  # ended before the branch point: no tree
    paused[id(env)] = _Paused([dict(m) for m in ctx.messages], ctx.context(), start)
    ctx.reward = 0.0  # nothing is read of the environment at the branch point
    return trajectory


def _branch_row(row: Row, env: Any) -> Row:
    """A member's row: a branch's prompt is the root's first messages (its reset adds none)."""
    if isinstance(env, Branch):
        return {**row, "prompt": env.paused.messages}
    return dict(row)


async def _tree_member(ctx: RolloutContext, env: Any) -> Trajectory:
    """A branch goes on from the root's context, its shared turns masked; any other member
    plays its protocol from the start."""
    markers = inline_markers(env)
    if not isinstance(env, Branch):
        return await (inline_rollout if markers else chat_rollout)(ctx, env)
    if markers:
        ctx.tools = []
    trajectory = ctx.resume(env.paused.context)
    trajectory.shared = [len(sample.completion_ids) for sample in trajectory.samples]
    if not env.train_shared:  # one tree per group: the shared turns have no baseline
        for sample in trajectory.samples:
            sample.loss_mask = [0] * len(sample.loss_mask)
    limit = ctx.limits.max_turns
    if not markers:
        if not await chat_turns(ctx, trajectory, env.branch_turn, limit):
            raise EpisodeEnd("max_turns")
        return trajectory
    try:  # the same assistant turn as the root's, written on from where it stopped
        if not await inline_turns(ctx, trajectory, markers, limit):
            raise EpisodeEnd("max_turns")
        return trajectory
    finally:
        add_inline_message(ctx, trajectory, env.paused.turn_start)
