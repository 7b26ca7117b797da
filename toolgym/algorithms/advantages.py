"""Advantages from the rewards of groups of episodes that started from the same state.

Trajectories that failed for infrastructure reasons (`Trajectory.failed`: `env_error`, a
reset or a worker that never started or a lost node, and `engine_error`) carry no signal about
the policy: they are left out of their group's baseline and get no advantage (they are also
left out of the loss). What the model caused stays in, with the reward its environment
reports: `tool_timeout` (its calls ran past a time limit), `tool_crash` (its call killed its
sandbox worker), `too_many_calls` (see `toolgym.agents.trajectory.Status`); a policy cannot
drop its own bad episodes from the loss. A group with fewer than two valid members has no
baseline and contributes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolgym.agents.trajectory import Trajectory


def group_advantages(
    rewards: Sequence[float],
    valid: Sequence[bool],
    group_size: int,
    *,
    baseline: str = "grpo",
    scale: str = "group",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages for consecutive groups of `group_size` rewards.

    Args:
        rewards: One reward per trajectory, groups consecutive.
        valid: False for trajectories to leave out (infrastructure failures).
        group_size: Members per group.
        baseline: "grpo" (the group mean) or "rloo" (the mean of the other valid members).
        scale: "group" (divide by the group's std), "batch" (by the std of all valid
            rewards), or "none".
        eps: Added to the std before dividing.

    Returns:
        (advantages, used): float advantages (0 where unused) and a bool mask of the
        trajectories that enter the loss.
    """
    if len(rewards) != len(valid) or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not form groups of {group_size}")
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, group_size)
    ok = torch.tensor(valid, dtype=torch.bool).view(-1, group_size)
    count = ok.sum(dim=1, keepdim=True)
    used = ok & (count >= 2)
    total = (r * ok).sum(dim=1, keepdim=True)
    if baseline == "grpo":
        base = total / count.clamp(min=1)
    elif baseline == "rloo":
        base = (total - r) / (count - 1).clamp(min=1)
    else:
        raise ValueError(f"unknown baseline {baseline!r}")
    advantages = torch.where(used, r - base, torch.zeros_like(r))
    if scale == "group":
        mean = total / count.clamp(min=1)
        var = (((r - mean) ** 2) * ok).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)
        advantages = advantages / (var.sqrt() + eps)
    elif scale == "batch":
        values = r[used]
        std = values.std() if values.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        advantages = advantages / (std + eps)
    elif scale != "none":
        raise ValueError(f"unknown scale {scale!r}")
    advantages = torch.where(used, advantages, torch.zeros_like(advantages))
    return advantages.flatten().float(), used.flatten()


def trainable(trajectory: Trajectory, mask_truncated: bool = False) -> bool:
    """Whether an episode takes part in the update: it did not fail for a reason outside the
    model (`Trajectory.failed`), some source scored it (a reward of None: TRL leaves such an
    episode out of its group too), it sampled tokens, and, with `mask_truncated`, it was not
    cut off by a length or turn limit."""
    if trajectory.failed or trajectory.reward is None:
        return False
    if not any(s.completion_ids for s in trajectory.samples):
        return False
    return not (mask_truncated and trajectory.status in ("length", "max_turns"))
