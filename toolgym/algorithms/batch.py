"""Training samples -> padded tensors for the loss.

A trajectory gives one sample (the episode as one sequence) or one per assistant turn
(templates that are not prefix-preserving; `Trajectory.samples`). Every tensor is (samples,
longest prompt + completion), right-padded. `loss_mask` is 1 only on tokens the model sampled:
prompt, observation (tool-result) and padding tokens are 0, so they count nowhere in the loss,
the KL or any normalisation. `episode_tokens` lets a per-episode normalisation (`grpo`) divide
a per-turn sample by its whole episode's sampled tokens, as if it were one sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from toolgym.agents.trajectory import Sample, Trajectory


@dataclass
class TokenBatch:
    """Padded samples of one micro-batch, ready for the loss."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    """1.0 on sampled tokens of trajectories that enter the loss."""
    sampling_logprobs: torch.Tensor
    """The engine's logprob of each sampled token (0 elsewhere)."""
    advantages: torch.Tensor
    """One per sample (its episode's)."""
    episode_tokens: torch.Tensor
    """Per sample: the sampled tokens of its whole episode (all its samples)."""
    token_advantages: torch.Tensor
    """Per position: the sample's advantage plus any per-step reward credited to that token
    (`GRPOConfig.step_rewards="tokens"`); the loss reads positions 1..L-1."""

    def to(self, device: torch.device | str) -> TokenBatch:
        """The batch on `device`."""
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
    """Pad the samples of `trajectories` into a TokenBatch (each sample takes its trajectory's
    advantage); samples of trajectories with `used` False get an all-zero loss mask."""
    samples, sample_advantages, sample_used, episode_tokens = [], [], [], []
    for index, trajectory in enumerate(trajectories):
        pieces = trajectory.samples()
        tokens = sum(sum(piece.loss_mask) for piece in pieces)
        for piece in pieces:
            samples.append(piece)
            sample_advantages.append(0.0 if advantages is None else float(advantages[index]))
            sample_used.append(True if used is None else bool(used[index]))
            episode_tokens.append(tokens)
    return collate_samples(samples, sample_advantages, sample_used, episode_tokens, pad_id=pad_id)


def collate_samples(
    samples: Sequence[Sample],
    advantages: Sequence[float],
    used: Sequence[bool],
    episode_tokens: Sequence[int],
    bonuses: Sequence[Sequence[float] | None] | None = None,
    *,
    pad_id: int,
) -> TokenBatch:
    """Pad samples into a TokenBatch; `bonuses` (per sample, one value per completion token)
    are added to the advantage of those tokens."""
    count = len(samples)
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    input_ids = torch.full((count, longest), pad_id, dtype=torch.long)
    attention = torch.zeros((count, longest), dtype=torch.long)
    loss_mask = torch.zeros((count, longest), dtype=torch.float32)
    logprobs = torch.zeros((count, longest), dtype=torch.float32)
    token_advantages = torch.tensor(advantages, dtype=torch.float32)[:, None].repeat(1, longest)
    for row, sample in enumerate(samples):
        bonus = bonuses[row] if bonuses is not None else None
        if bonus:
            start = len(sample.prompt_ids)
            token_advantages[row, start : start + len(bonus)] += torch.tensor(bonus)
        start, ids = len(sample.prompt_ids), sample.prompt_ids + sample.completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        if used[row]:
            loss_mask[row, start : len(ids)] = torch.tensor(sample.loss_mask, dtype=torch.float)
        if sample.logprobs:
            logprobs[row, start : len(ids)] = torch.tensor(sample.logprobs)
    return TokenBatch(
        input_ids,
        attention,
        loss_mask,
        logprobs * loss_mask,
        torch.tensor(advantages, dtype=torch.float32),
        torch.tensor(episode_tokens, dtype=torch.float32),
        token_advantages,
    )
