"""Dynamic sampling (DAPO): a step trains on groups that carry signal.

A group whose members' rewards are all equal (or that has fewer than two members in the
update) has no advantage (unless `step_rewards="tokens"` puts a member's step rewards on its
tokens): it costs its rollouts and teaches nothing. With
`GRPOConfig.dynamic_sampling`, after a step's groups are played, such groups are replaced by
groups of fresh rows played in extra rounds (each one generation batch of `prompts_per_step`
rows, at most `dynamic_sampling_rounds` of them), until the step holds `prompts_per_step`
groups with signal. The update's batch stays as configured: when the rounds run out, the
step's own signal-less groups fill it (they contribute nothing, as without dynamic sampling).
The extra rows are drawn from a seeded stream of their own (a resumed run draws the same),
and their seeds never repeat a step's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.advantages import trainable

Row = dict[str, Any]


def has_signal(
    group: Sequence[Trajectory], mask_truncated: bool = False, step_credit: bool = False
) -> bool:
    """Whether a group's update members (at least two) got rewards that differ, or, with
    `step_credit` (`GRPOConfig.step_rewards="tokens"`: step rewards are added to their spans'
    tokens, not to the reward), whether any of them has a nonzero step reward."""
    members = [t for t in group if trainable(t, mask_truncated)]
    if len(members) < 2:
        return False
    if step_credit and any(step["reward"] for t in members for step in t.step_rewards):
        return True
    return len({t.reward for t in members}) > 1


def extra_rows(
    train_rows: Sequence[Row], count: int, seed: int, step: int, round_: int
) -> tuple[list[Row], list[int]]:
    """`count` rows for extra round `round_` (1, 2, ...) of step `step`, and one reset seed
    each, from a stream seeded by (seed, step, round) that the steps' own draws never use."""
    stream = random.Random(f"toolgym-dynamic-sampling:{seed}:{step}:{round_}")
    if count <= len(train_rows):
        picked = stream.sample(range(len(train_rows)), count)
    else:
        picked = [stream.randrange(len(train_rows)) for _ in range(count)]
    seeds = [stream.randrange(2**31) for _ in range(count)]
    return [dict(train_rows[i]) for i in picked], seeds


@dataclass
class Played:
    """One round's groups: each group's trajectories and its per-source rewards."""

    groups: list[list[Trajectory]]
    sources: list[dict[str, list[float]]]
    reward_metrics: dict[str, list[float]] = field(default_factory=dict)


def split(
    trajectories: list[Trajectory],
    sources: dict[str, list[float]],
    group_size: int,
    reward_metrics: dict[str, list[float]] | None = None,
) -> Played:
    """A round's trajectories (groups consecutive) and per-source lists, by group."""
    groups, per_group = [], []
    for first in range(0, len(trajectories), group_size):
        part = slice(first, first + group_size)
        groups.append(trajectories[part])
        per_group.append({name: values[part] for name, values in sources.items()})
    return Played(groups, per_group, dict(reward_metrics or {}))


def fill_with_signal(
    first: Played,
    play_round: Callable[[int], Played],
    wanted: int,
    rounds: int,
    mask_truncated: bool = False,
    step_credit: bool = False,
) -> tuple[list[Trajectory], dict[str, list[float]], dict[str, list[float]], dict[str, float]]:
    """The step's groups: those of `first` and of up to `rounds` extra rounds
    (`play_round(r)`) that carry signal (`has_signal`), in the order played, topped up with
    `first`'s signal-less groups to `wanted`. Returns the trajectories, the per-source rewards,
    the reward functions' logged values and the figures for the step's metrics
    (`dynamic_rounds`, `dynamic_groups_played`, `dynamic_groups_kept_without_signal`)."""
    kept: list[tuple[list[Trajectory], dict[str, list[float]]]] = []
    idle: list[tuple[list[Trajectory], dict[str, list[float]]]] = []
    logged: dict[str, list[float]] = {}
    played_rounds, played_groups = 0, 0

    def take(played: Played, keep_idle: bool) -> None:
        nonlocal played_groups
        played_groups += len(played.groups)
        for name, values in played.reward_metrics.items():
            logged.setdefault(name, []).extend(values)
        for group, sources in zip(played.groups, played.sources, strict=True):
            if has_signal(group, mask_truncated, step_credit):
                kept.append((group, sources))
            elif keep_idle:
                idle.append((group, sources))

    take(first, keep_idle=True)
    while len(kept) < wanted and played_rounds < rounds:
        played_rounds += 1
        take(play_round(played_rounds), keep_idle=False)
    chosen = kept[:wanted]
    chosen += idle[: wanted - len(chosen)]
    trajectories = [t for group, _ in chosen for t in group]
    names = {name for _, sources in chosen for name in sources}
    sources: dict[str, list[float]] = {name: [] for name in sorted(names)}
    for group, group_sources in chosen:
        for name in sources:
            sources[name].extend(group_sources.get(name, [float("nan")] * len(group)))
    figures = {
        "dynamic_rounds": float(played_rounds),
        "dynamic_groups_played": float(played_groups),
        "dynamic_groups_kept_without_signal": float(max(0, wanted - len(kept))),
    }
    return trajectories, sources, logged, figures
