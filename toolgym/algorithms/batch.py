"""Trajectories -> padded tensors for the loss.

Every tensor is (trajectories, longest prompt + completion), right-padded. `loss_mask` is 1
only on tokens the model sampled: prompt, observation (tool-result) and padding tokens are 0,
so they count nowhere in the loss, the KL or any normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from toolgym.agents.trajectory import Trajectory


@dataclass
class TokenBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    """1.0 on sampled tokens of trajectories that enter the loss."""
    sampling_logprobs: torch.Tensor
    """The engine's logprob of each sampled token (0 elsewhere)."""
    advantages: torch.Tensor
    """One per trajectory."""

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in vars(self).values()))

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def targets(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mask, sampling logprobs) of the predicted tokens 1..L-1, and the token count."""
        mask = self.loss_mask[:, 1:]
        return mask, self.sampling_logprobs[:, 1:], mask.sum()


def collate(
    trajectories: Sequence[Trajectory],
    pad_id: int,
    advantages: Sequence[float] | torch.Tensor | None = None,
    used: Sequence[bool] | torch.Tensor | None = None,
) -> TokenBatch:
    """Pad trajectories into a TokenBatch; rows with `used` False get an all-zero loss mask."""
    count = len(trajectories)
    longest = max(len(t.prompt_ids) + len(t.completion_ids) for t in trajectories)
    input_ids = torch.full((count, longest), pad_id, dtype=torch.long)
    attention = torch.zeros((count, longest), dtype=torch.long)
    loss_mask = torch.zeros((count, longest), dtype=torch.float32)
    logprobs = torch.zeros((count, longest), dtype=torch.float32)
    for row, trajectory in enumerate(trajectories):
        start, ids = len(trajectory.prompt_ids), trajectory.prompt_ids + trajectory.completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        if used is None or bool(used[row]):
            loss_mask[row, start : len(ids)] = torch.tensor(trajectory.loss_mask, dtype=torch.float)
        if trajectory.logprobs:
            logprobs[row, start : len(ids)] = torch.tensor(trajectory.logprobs)
    advantage = torch.zeros(count) if advantages is None else torch.as_tensor(advantages).float()
    return TokenBatch(input_ids, attention, loss_mask, logprobs * loss_mask, advantage)
