"""Credit for one step's batch: which advantage each episode, and each of its tokens, gets.

Every episode gets its group-relative advantage (`group_advantages`: GRPO's mean baseline or
RLOO's leave-one-out, over every process's episodes). Then at most one finer rule replaces it
token by token:
- groups played as several trees (`tree_size`): a member's own turns against its siblings,
  the shared turns with their tree's mean against the group's
  (`toolgym.algorithms.tree_credit`);
- `credit="turn"`: each turn's tokens get the advantage of what followed them
  (`toolgym.algorithms.turn_credit`);
- otherwise, where an episode has several roles or a role reward, each role's tokens get the
  advantage of that role against the same role in the group's other episodes
  (`toolgym.algorithms.role_baselines`; nothing changes for one-role episodes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.advantages import group_advantages, trainable
from toolgym.algorithms.config import GRPOConfig
from toolgym.algorithms.role_baselines import needs_roles, role_credit, role_rewards
from toolgym.algorithms.tree_credit import tree_credit
from toolgym.algorithms.turn_credit import batch_credit

TokenCredit = list[list[list[float]]]
"""Per trajectory, per sample, per completion token: the advantage of that token."""


@dataclass
class Credit:
    """The advantages of one step's batch."""

    everyone: list[tuple[float, bool]]
    """Every process's episodes in step order: (reward, trainable)."""
    advantages: torch.Tensor
    """One advantage per episode of the step (every process's)."""
    used: torch.Tensor
    """Whether each episode of the step enters the update (trainable, in a group with signal)."""
    tokens: TokenCredit | None
    """This process's per-token advantages where a finer rule applies; None: each episode's
    advantage on all of its tokens."""


def assign_credit(
    trajectories: Sequence[Trajectory],
    share: Sequence[int],
    args: GRPOConfig,
    gather: Callable[[list[Any]], list[Any]],
) -> Credit:
    """The credit of this process's `trajectories` (`share`: their indices in the step's order)
    from every process's episodes (`gather` collects a list from every process in order)."""
    valid = functools.partial(trainable, mask_truncated=args.mask_truncated)
    everyone = gather([(t.reward or 0.0, valid(t)) for t in trajectories])
    rewards, trainables = [r for r, _ in everyone], [v for _, v in everyone]
    advantages, used = group_advantages(
        rewards,
        trainables,
        args.num_generations,
        baseline=args.advantage,
        scale=args.scale_rewards,
    )
    tokens: TokenCredit | None
    if args.tree_size and args.tree_size < args.num_generations:  # several trees a group
        if needs_roles(gather([role_rewards(t) for t in trajectories]), rewards):
            raise ValueError(
                "several trees per group (tree_size) and episodes of several roles or role "
                "rewards each credit tokens their own way; per-role baselines inside trees "
                "are not built yet: use one tree per group or one role"
            )
        tokens = tree_credit(
            trajectories,
            share,
            everyone,
            args.num_generations,
            args.tree_size,
            args.advantage,
            args.scale_rewards,
            gather,
            step_credit=args.step_rewards == "tokens",
        )
    elif args.credit == "turn":
        tokens = batch_credit(
            trajectories, everyone, share, args.num_generations, args.scale_rewards, gather
        )
    else:  # several roles in an episode: a baseline per role (None: one role, as ever)
        tokens = role_credit(
            trajectories,
            share,
            advantages,
            trainables,
            args.num_generations,
            args.advantage,
            args.scale_rewards,
            gather,
            step_credit=args.step_rewards == "tokens",
        )
    return Credit(everyone, advantages, used, tokens)
