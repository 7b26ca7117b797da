"""Credit for groups played as several trees (`GRPOConfig.tree_size`).

A group of G episodes of one row is played as G / M trees of M members
(`toolgym.algorithms.tree_rollouts`): each tree's root plays the first turns once, and its M
members go on from there. Each member's trajectory holds the shared turns (the first
`Trajectory.shared[j]` completion tokens of its sample j) and its own turns after the branch.

Two levels of credit, in float64:
- a member's own tokens: its reward against its tree's mean (`advantage="rloo"`: the mean
  of its siblings), so siblings are each other's baseline;
- the shared tokens: the tree's mean reward against the group's mean (`"rloo"`: the mean of
  the other trees' means). Every member holds a copy of them with this same advantage, so the
  gradient is the prefix's, trained once, times the members it stands for: the sum a group
  of M independent episodes with these first turns would give it.

With GRPO's baseline the advantages of a member's tokens add up to GRPO's own: the shared
part's plus the member's part is its reward against the group's mean (with RLOO's, each level
has its own leave-one-out mean, and the sum is not plain RLOO's). An episode played on its
own (a root that ended before the branch point plays its tree's rows from the start) is a tree
of one: all its tokens get its reward against the group's baseline (GRPO's exactly; RLOO's
other trees' mean). A branched tree with one valid member gives that member's own tokens 0.
Infrastructure failures (`trainable` false) are left out of every mean; a tree without a valid
member does not count among the trees. Advantages are scaled as `group_advantages` scales them (the
group's reward std, the batch's, or none); step rewards credited to tokens
(`step_rewards="tokens"`) are added on their spans, as without trees.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.rewards import step_reward_bonus, step_reward_sample


def member_advantages(
    rewards: Sequence[float],
    valid: Sequence[bool],
    trees: Sequence[Hashable],
    baseline: str = "grpo",
) -> list[tuple[float, float]]:
    """For one group: each member's (shared, own) advantage before scaling. `trees` names
    each member's tree (members of a tree share its first turns; a tree of one has none)."""
    if not len(rewards) == len(valid) == len(trees):
        raise ValueError("tree credit needs one reward, validity and tree per member")
    if baseline not in ("grpo", "rloo"):
        raise ValueError(f"unknown baseline {baseline!r}")
    members: dict[Hashable, list[float]] = {}
    for reward, ok, tree in zip(rewards, valid, trees, strict=True):
        if ok:
            members.setdefault(tree, []).append(float(reward))
    means = {tree: statistics.fmean(values) for tree, values in members.items()}
    kept = [float(r) for r, ok in zip(rewards, valid, strict=True) if ok]
    if len(kept) < 2:
        return [(0.0, 0.0)] * len(rewards)
    group_mean = statistics.fmean(kept)
    result = []
    for reward, ok, tree in zip(rewards, valid, trees, strict=True):
        if not ok:
            result.append((0.0, 0.0))
            continue
        mean, siblings = means[tree], members[tree]
        if baseline == "grpo":
            shared, own = mean - group_mean, reward - mean
        else:
            others = [m for t, m in means.items() if t != tree]
            shared = mean - statistics.fmean(others) if others else 0.0
            rest = len(siblings) - 1
            own = reward - (sum(siblings) - reward) / rest if rest else 0.0
        result.append((shared, own))
    return result


def tree_credit(
    trajectories: Sequence[Trajectory],
    share: Sequence[int],
    everyone: Sequence[tuple[float, bool]],
    group_size: int,
    tree_size: int,
    baseline: str,
    scale: str,
    gather: Callable[[list[Any]], list[Any]],
    step_credit: bool = False,
    eps: float = 1e-4,
) -> list[list[list[float]]]:
    """This process's trajectories' per-token advantages (per trajectory, per sample, per
    completion token). `everyone`: every process's (reward, trainable) in step order;
    `share`: this process's indices in it; `gather` collects a list from every process."""
    if group_size % tree_size or len(everyone) % group_size:
        raise ValueError(f"{len(everyone)} episodes do not form groups of trees of {tree_size}")
    branched = gather([bool(t.shared) for t in trajectories])
    pairs = scaled_advantages(everyone, branched, group_size, tree_size, baseline, scale, eps)
    return [
        _tokens(trajectory, *pairs[i], step_credit)
        for trajectory, i in zip(trajectories, share, strict=True)
    ]


def scaled_advantages(
    everyone: Sequence[tuple[float, bool]],
    branched: Sequence[bool],
    group_size: int,
    tree_size: int,
    baseline: str,
    scale: str,
    eps: float = 1e-4,
) -> list[tuple[float, float]]:
    """Every episode's (shared, own) advantage, scaled as `group_advantages` scales: by its
    group's reward std, the batch's (over episodes in groups of two or more valid), or not."""
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale {scale!r}")
    pairs: list[tuple[float, float]] = []
    spreads: list[float] = []
    in_batch: list[float] = []  # the rewards `scale="batch"` takes the std of
    for start in range(0, len(everyone), group_size):
        members = range(start, start + group_size)
        rewards = [everyone[i][0] for i in members]
        valid = [everyone[i][1] for i in members]
        trees = [i // tree_size if branched[i] else ("alone", i) for i in members]
        pairs.extend(member_advantages(rewards, valid, trees, baseline))
        kept = [r for r, ok in zip(rewards, valid, strict=True) if ok]
        spreads.append(statistics.stdev(kept) if len(kept) > 1 else 0.0)
        in_batch.extend(kept if len(kept) > 1 else [])
    batch_spread = statistics.stdev(in_batch) if len(in_batch) > 1 else 0.0
    divisors = {"group": [s + eps for s in spreads], "batch": [batch_spread + eps] * len(spreads)}
    return [
        (shared / divisors[scale][i // group_size], own / divisors[scale][i // group_size])
        if scale != "none"
        else (shared, own)
        for i, (shared, own) in enumerate(pairs)
    ]


def _tokens(
    trajectory: Trajectory, shared: float, own: float, step_credit: bool
) -> list[list[float]]:
    """One episode's per-token credit: `shared` on the tokens it shares with its tree (all
    of them for a tree of one), `own` after; step rewards added on their spans."""
    credited = (
        {step_reward_sample(trajectory, s) for s in trajectory.step_rewards}
        if step_credit
        else set()
    )
    samples = []
    for at, sample in enumerate(trajectory.samples):
        length = len(sample.completion_ids)
        if not trajectory.shared:  # a tree of one: its own mean is its reward
            cut = length
        else:
            cut = min(trajectory.shared[at], length) if at < len(trajectory.shared) else 0
        tokens = [shared] * cut + [own] * (length - cut)
        if at in credited:
            bonus = step_reward_bonus(trajectory, at)
            tokens = [value + extra for value, extra in zip(tokens, bonus, strict=True)]
        samples.append(tokens)
    return samples
