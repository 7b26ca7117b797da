"""Turn-level credit: each assistant turn's tokens get the advantage of what followed them.

With `GRPOConfig.credit="turn"`, the advantage of turn t of episode i is

    A[i, t] = (G[i, t] - b[i, t]) / scale
    G[i, t] = R[i] - sum of the episode's step rewards before turn t      (reward-to-go)
    b[i, t] = mean of G[j, t] over the other valid members j of the group that reached turn t

where `R[i]` is the episode's reward (its step rewards included, `step_rewards="return"`) and a
step reward belongs to the turn whose tokens end its span. Turn 1's advantage is RLOO's
episode advantage; later turns are judged only by what came after them.

Why this baseline: a baseline built from episode i's own turns (normalising each turn index
over the group, own member included, then summing over the turns i played) has as many terms
as i has turns, and i's actions choose that number, so the gradient is biased wherever the
policy decides when to stop (verl #7244). `b[i, t]` reads only the other members, which are
independent of episode i, so `E[b * grad log pi(a[i, t])] = 0` and the estimator is unbiased
for episodes of any lengths (`tests/test_algorithms/test_turn_credit.py` checks the expectation
exactly on a small game where the policy controls its length). A turn no other member reached has no
baseline (b = 0).

Turns are the runs of sampled tokens (loss mask 1) across an episode's samples, in order: one
per assistant turn, whether the episode trains as one sequence (tool results between the runs
are masked) or one sample per turn. An inline episode (one run with several marked steps) is
one turn: use `step_rewards="tokens"` to credit its steps' spans.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.rewards import step_reward_sample


@dataclass(frozen=True)
class Turn:
    """One assistant turn: a run of sampled tokens in one sample's completion."""

    sample: int
    start: int
    end: int
    """Exclusive."""


def turns(trajectory: Trajectory) -> list[Turn]:
    """The episode's turns: each run of sampled tokens, sample by sample, in order."""
    found: list[Turn] = []
    for index, sample in enumerate(trajectory.samples):
        start = None
        for position, sampled in enumerate([*sample.loss_mask, 0]):
            if sampled and start is None:
                start = position
            elif not sampled and start is not None:
                found.append(Turn(index, start, position))
                start = None
    return found


def turn_rewards(trajectory: Trajectory, spans: Sequence[Turn]) -> list[float]:
    """Each turn's step rewards: a step belongs to the turn holding its span's last token
    (`end - 1`), else to the last turn of its sample that starts before its end, else to the
    episode's last turn."""
    rewards = [0.0] * len(spans)
    if not spans:
        return rewards
    for step in trajectory.step_rewards:
        at, last = step_reward_sample(trajectory, step), int(step["end"]) - 1
        owner = len(spans) - 1
        candidates = [k for k, turn in enumerate(spans) if turn.sample == at and turn.start <= last]
        if candidates:
            owner = candidates[-1]
        rewards[owner] += float(step["reward"])
    return rewards


def turn_advantages(
    totals: Sequence[float],
    rewards_per_turn: Sequence[Sequence[float]],
    valid: Sequence[bool],
    group_size: int,
    *,
    scale: str = "group",
    eps: float = 1e-4,
) -> list[list[float]]:
    """Per episode, one advantage per turn (the formula in this module's docstring), in
    float64; episodes that are not valid, or whose group has fewer than two valid members, get
    0 on every turn. `scale`: "group" (divide by the std of the group's valid rewards), "batch"
    (by the std of all valid rewards) or "none", as `group_advantages`."""
    count = len(totals)
    if len(rewards_per_turn) != count or len(valid) != count or count % group_size:
        raise ValueError(f"{count} episodes do not form groups of {group_size}")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale {scale!r}")
    to_go = [
        _rewards_to_go(float(total), turn)
        for total, turn in zip(totals, rewards_per_turn, strict=True)
    ]
    kept = [float(t) for t, ok in zip(totals, valid, strict=True) if ok]
    batch_scale = _std(kept) + eps
    result: list[list[float]] = []
    for first in range(0, count, group_size):
        members = range(first, first + group_size)
        live = [j for j in members if valid[j]]
        group_scale = {"group": _std([float(totals[j]) for j in live]) + eps, "batch": batch_scale}
        divide = group_scale.get(scale, 1.0)
        for i in members:
            if not valid[i] or len(live) < 2:
                result.append([0.0] * len(to_go[i]))
                continue
            advantages = []
            for t, value in enumerate(to_go[i]):
                others = [to_go[j][t] for j in live if j != i and len(to_go[j]) > t]
                baseline = math.fsum(others) / len(others) if others else 0.0
                advantages.append((value - baseline) / divide)
            result.append(advantages)
    return result


def token_credit(
    trajectory: Trajectory, spans: Sequence[Turn], advantages: Sequence[float]
) -> list[list[float]]:
    """Per sample, per completion token: the advantage of the turn it belongs to (0 on tokens
    of no turn: tool results and template text, which the loss never reads)."""
    credit = [[0.0] * len(sample.completion_ids) for sample in trajectory.samples]
    for turn, advantage in zip(spans, advantages, strict=True):
        credit[turn.sample][turn.start : turn.end] = [advantage] * (turn.end - turn.start)
    return credit


def batch_credit(
    trajectories: Sequence[Trajectory],
    everyone: Sequence[tuple[float, bool]],
    share: Sequence[int],
    group_size: int,
    scale: str,
    gather: Callable[[list[Any]], list[Any]],
) -> list[list[list[float]]]:
    """This process's trajectories' per-token advantages, from every process's episodes:
    `everyone` holds each episode's (reward, valid) in step order, `share` this process's
    indices in it, `gather` collects a list from every process in that order."""
    spans = [turns(t) for t in trajectories]
    rewards = gather([turn_rewards(t, s) for t, s in zip(trajectories, spans, strict=True)])
    advantages = turn_advantages(
        [r for r, _ in everyone], rewards, [v for _, v in everyone], group_size, scale=scale
    )
    return [
        token_credit(t, s, advantages[i])
        for t, s, i in zip(trajectories, spans, share, strict=True)
    ]


def _rewards_to_go(total: float, rewards: Sequence[float]) -> list[float]:
    """G[t] = total - the rewards of the turns before t (G[0] = total)."""
    to_go, earned = [], 0.0
    for reward in rewards:
        to_go.append(total - earned)
        earned += reward
    return to_go


def _std(values: Sequence[float]) -> float:
    """The unbiased standard deviation (0 for fewer than two values), as torch.std."""
    if len(values) < 2:
        return 0.0
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
