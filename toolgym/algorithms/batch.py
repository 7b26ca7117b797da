"""Training samples -> padded tensors for the loss.

Every trajectory holds its samples (`Trajectory.samples`): one for an episode played as one
sequence, one per assistant turn for templates that are not prefix-preserving.
`training_samples` pairs each sample with what the loss needs of its episode (advantage,
whether it enters the loss, its sampled tokens, per-token step-reward credit), and `collate`
pads any selection of them into a `TokenBatch`: every tensor is (samples, longest prompt +
completion), right-padded. `loss_mask` is 1 only on tokens the model sampled: prompt,
observation (tool-result) and padding tokens are 0, so they count nowhere in the loss, the KL
or any normalisation. `episode_tokens` lets a per-episode normalisation (`grpo`) divide a
per-turn sample by its whole episode's sampled tokens, as if it were one sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.algorithms.rewards import step_reward_bonus, step_reward_sample


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
    images: list[str] = field(default_factory=list)
    """The images the rows show, in row order (`toolgym.agents.images`)."""

    def to(self, device: torch.device | str) -> TokenBatch:
        """The batch on `device`."""
        tensors = {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return replace(self, **{k: v.to(device) for k, v in tensors.items()})  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def targets(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mask, sampling logprobs) of the predicted tokens 1..L-1, and the token count."""
        mask = self.loss_mask[:, 1:]
        return mask, self.sampling_logprobs[:, 1:], mask.sum()


@dataclass(frozen=True)
class TrainingSample:
    """One sample with what the loss needs of its episode."""

    sample: Sample
    advantage: float = 0.0
    """Its episode's advantage."""
    used: bool = True
    """Whether its episode enters the loss (else its loss mask is all zeros)."""
    episode_tokens: int = 0
    """The sampled tokens of its whole episode (`Trajectory.model_tokens`)."""
    bonus: list[float] | None = None
    """Per completion token, added to the advantage (step-reward credit), or None."""

    @property
    def length(self) -> int:
        """Prompt and completion tokens."""
        return len(self.sample.prompt_ids) + len(self.sample.completion_ids)


def training_samples(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float] | torch.Tensor | None = None,
    used: Sequence[bool] | torch.Tensor | None = None,
    step_credit: bool = False,
    turn_credit: Sequence[list[list[float]]] | None = None,
) -> list[TrainingSample]:
    """Every sample of every trajectory, in order, with its trajectory's advantage (default
    0) and `used` flag (default True); with `step_credit`, the episode's step rewards (an
    inline episode's per-step rewards, a chat episode's tool calls' rewards) credit the
    tokens of their spans (`rewards.step_reward_bonus`), each in the sample it names (the
    last, where it names none). `turn_credit` (per trajectory, per sample, per completion
    token: `turn_credit.token_credit`) replaces both: each token's advantage is its turn's."""
    for name, values in (("advantages", advantages), ("used", used), ("turn_credit", turn_credit)):
        if values is not None and len(values) != len(trajectories):
            raise ValueError(f"{len(values)} {name} for {len(trajectories)} trajectories")
    rows: list[TrainingSample] = []
    for index, trajectory in enumerate(trajectories):
        advantage = 0.0 if advantages is None else float(advantages[index])
        use = True if used is None else bool(used[index])
        tokens = trajectory.model_tokens
        credited = (
            {step_reward_sample(trajectory, step) for step in trajectory.step_rewards}
            if step_credit
            else set()
        )
        if turn_credit is not None:
            credit = turn_credit[index]
            rows.extend(
                TrainingSample(sample, 0.0, use, tokens, credit[at])
                for at, sample in enumerate(trajectory.samples)
            )
            continue
        rows.extend(
            TrainingSample(
                sample,
                advantage,
                use,
                tokens,
                step_reward_bonus(trajectory, at) if at in credited else None,
            )
            for at, sample in enumerate(trajectory.samples)
        )
    return rows


def collate(rows: Sequence[TrainingSample], pad_id: int) -> TokenBatch:
    """Pad samples into a TokenBatch (e.g. `collate(training_samples(trajectories), pad_id)`,
    or a micro-batch of them); each row's `bonus` is added to the advantage of its completion
    tokens."""
    count = len(rows)
    longest = max(row.length for row in rows)
    input_ids = torch.full((count, longest), pad_id, dtype=torch.long)
    attention = torch.zeros((count, longest), dtype=torch.long)
    loss_mask = torch.zeros((count, longest), dtype=torch.float32)
    logprobs = torch.zeros((count, longest), dtype=torch.float32)
    advantages = torch.tensor([row.advantage for row in rows], dtype=torch.float32)
    token_advantages = advantages[:, None].repeat(1, longest)
    for index, row in enumerate(rows):
        sample = row.sample
        start, ids = len(sample.prompt_ids), sample.prompt_ids + sample.completion_ids
        if row.bonus:
            token_advantages[index, start : start + len(row.bonus)] += torch.tensor(row.bonus)
        input_ids[index, : len(ids)] = torch.tensor(ids)
        attention[index, : len(ids)] = 1
        if row.used:
            loss_mask[index, start : len(ids)] = torch.tensor(sample.loss_mask, dtype=torch.float)
        if sample.logprobs:
            logprobs[index, start : len(ids)] = torch.tensor(sample.logprobs)
    return TokenBatch(
        input_ids,
        attention,
        loss_mask,
        logprobs * loss_mask,
        advantages,
        torch.tensor([row.episode_tokens for row in rows], dtype=torch.float32),
        token_advantages,
        [image for row in rows for image in row.sample.images],
    )


def idle_batch(batches: Sequence[TokenBatch], pad_id: int, device: torch.device) -> TokenBatch:
    """A micro-batch that trains on nothing (no token in the loss, advantages 0), for a
    process with fewer micro-batches than another to pass through the model as often: the
    first of `batches` emptied, or one row of two padding tokens where there is none."""
    if batches:
        ids, attention = batches[0].input_ids, batches[0].attention_mask
    else:
        ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
        attention = torch.ones_like(ids)
    zeros = torch.zeros(ids.shape, dtype=torch.float32, device=device)
    rows = ids.shape[0]
    return TokenBatch(
        input_ids=ids,
        attention_mask=attention,
        loss_mask=zeros,
        sampling_logprobs=zeros,
        advantages=torch.zeros(rows, device=device),
        episode_tokens=torch.ones(rows, device=device),
        token_advantages=zeros,
        images=batches[0].images if batches else [],
    )
