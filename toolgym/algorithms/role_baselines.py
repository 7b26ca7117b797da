"""Per-role baselines: episodes whose samples play several roles (a caller and its helper, a
proposer and a solver, two players) get one advantage per role.

Each sample names its role (`Sample.role`); an episode may score its roles apart
(`Trajectory.role_rewards`; a role it does not score gets the episode's reward). For each role,
the group's episodes that have samples of that role form that role's baseline, exactly as the
episode-level baseline is formed (`group_advantages`: GRPO's mean or RLOO's leave-one-out
mean, scaled as configured), and each of the episode's samples gets its role's advantage on
every token. A role that fewer than two valid episodes of its group play has no baseline of its
own: its samples get the episode's advantage. Episodes of a single role with no role rewards
are not touched (their advantage is the episode's, as without this module).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.advantages import group_advantages
from toolgym.algorithms.rewards import step_reward_bonus, step_reward_sample

RoleRewards = dict[str, float]
"""One episode's reward per role it plays."""


def role_rewards(trajectory: Trajectory) -> RoleRewards:
    """The reward of each role the episode's samples play: its `role_rewards` entry, else
    the episode's reward (None counts 0, as in training)."""
    episode = trajectory.reward or 0.0
    roles = {sample.role for sample in trajectory.samples}
    return {role: float(trajectory.role_rewards.get(role, episode)) for role in sorted(roles)}


def needs_roles(per_episode: Sequence[RoleRewards], rewards: Sequence[float]) -> bool:
    """Whether any episode plays more than one role or scores a role apart from the episode."""
    return any(
        len(roles) > 1 or any(value != reward for value in roles.values())
        for roles, reward in zip(per_episode, rewards, strict=True)
    )


def role_advantages(
    per_episode: Sequence[RoleRewards],
    episode_advantages: Sequence[float] | torch.Tensor,
    valid: Sequence[bool],
    group_size: int,
    baseline: str = "grpo",
    scale: str = "group",
) -> list[dict[str, float]]:
    """Each episode's advantage per role it plays: the role's own group baseline where at
    least two valid episodes of the group play it, else the episode's advantage."""
    roles = sorted({role for episode in per_episode for role in episode})
    result: list[dict[str, float]] = [{} for _ in per_episode]
    for role in roles:
        plays = [role in episode for episode in per_episode]
        rewards = [episode.get(role, 0.0) for episode in per_episode]
        own = [v and p for v, p in zip(valid, plays, strict=True)]
        advantages, used = group_advantages(
            rewards, own, group_size, baseline=baseline, scale=scale
        )
        for index, episode in enumerate(per_episode):
            if role in episode:
                value = advantages[index] if used[index] else episode_advantages[index]
                result[index][role] = float(value)
    return result


def role_credit(
    trajectories: Sequence[Trajectory],
    share: Sequence[int],
    episode_advantages: torch.Tensor,
    valid: Sequence[bool],
    group_size: int,
    baseline: str,
    scale: str,
    gather: Callable[[list[Any]], list[Any]],
    step_credit: bool = False,
) -> list[list[list[float]]] | None:
    """This process's trajectories' per-token advantages by role (per trajectory, per sample,
    per completion token), from every process's episodes (`share`: this process's indices in
    the step's order; `gather` collects a list from every process in that order); with
    `step_credit` (`GRPOConfig.step_rewards="tokens"`), each step reward added to the tokens
    of its span, as without roles. None where no episode of the step has more than one role
    or a role reward (nothing to do)."""
    per_episode = gather([role_rewards(t) for t in trajectories])
    rewards = gather([t.reward or 0.0 for t in trajectories])
    if not needs_roles(per_episode, rewards):
        return None
    by_role = role_advantages(
        per_episode, episode_advantages, valid, group_size, baseline=baseline, scale=scale
    )
    credit = []
    for trajectory, i in zip(trajectories, share, strict=True):
        samples = []
        credited = {step_reward_sample(trajectory, s) for s in trajectory.step_rewards}
        for at, sample in enumerate(trajectory.samples):
            tokens = [by_role[i][sample.role]] * len(sample.completion_ids)
            if step_credit and at in credited:
                bonus = step_reward_bonus(trajectory, at)
                tokens = [value + extra for value, extra in zip(tokens, bonus, strict=True)]
            samples.append(tokens)
        credit.append(samples)
    return credit
