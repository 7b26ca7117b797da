"""Which update's weights sampled each token.

An engine that counts its weight loads (`weights_version`) stamps every sampled token with
the count it held (`Sample.versions`); the trainer maps each count to the step whose weights
it loaded. With partial rollouts (`GRPOConfig.partial_rollouts`) an episode's tokens, even one
completion's, may come from several updates: a token's staleness is the updates between the
weights that sampled it and the step that learns from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolgym.agents.trajectory import Trajectory


class PolicyVersions:
    """The trainer's map from the engine's `weights_version` to training steps.

    Args:
        engine: The rollout engine (one without `weights_version` records nothing).
        step: The step whose weights the engine holds now.
    """

    def __init__(self, engine: Any, step: int = 0) -> None:
        self.engine = engine
        self._step_of: dict[int, int] = {}
        self.loaded(step)

    def loaded(self, step: int) -> None:
        """The engine now holds the weights of `step` (call after each weight sync)."""
        version = getattr(self.engine, "weights_version", None)
        if isinstance(version, int):
            self._step_of[version] = step

    def token_steps(self, trajectory: Trajectory) -> list[int]:
        """The step of the weights that sampled each of the episode's model tokens (those the
        engine stamped with a version the trainer knows)."""
        steps = []
        for sample in trajectory.samples:
            if len(sample.versions) != len(sample.loss_mask):
                continue  # not recorded
            for version, sampled in zip(sample.versions, sample.loss_mask, strict=True):
                if sampled and version in self._step_of:
                    steps.append(self._step_of[version])
        return steps

    def step_figures(
        self,
        trajectories: Sequence[Trajectory],
        step: int,
        fallback: int,
        gather: Callable[[list[Any]], list[Any]],
    ) -> dict[str, float]:
        """Stamp each episode's metrics with `staleness` (its oldest token's: updates between
        those weights and `step`; `fallback`, the rollouts' starting step, where no token says)
        and `policy_versions` (how many weights sampled it), and return the step's
        `token_staleness` (mean over model tokens), `token_staleness_max` and
        `mixed_policy_episodes` (the share played by more than one update's weights), over
        every process's episodes (`gather`)."""
        mine = []
        for trajectory in trajectories:
            steps = self.token_steps(trajectory) or [fallback]
            ages = [step - s for s in steps]
            trajectory.metrics.update(staleness=max(ages), policy_versions=len(set(steps)))
            mine.append((len(ages), sum(ages), max(ages), len(set(steps)) > 1))
        everyone = gather(mine)
        tokens = sum(count for count, *_ in everyone)
        return {
            "token_staleness": sum(total for _, total, _, _ in everyone) / max(tokens, 1),
            "token_staleness_max": float(max((m for _, _, m, _ in everyone), default=0)),
            "mixed_policy_episodes": sum(mixed for *_, mixed in everyone) / max(len(everyone), 1),
        }
