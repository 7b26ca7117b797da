"""`EngineWeights`: the engine's copy of the policy, kept in step with the learner.

The learner updates the policy; the engine samples with whatever weights it was last given.
This object gives it the learner's weights (`sync`) and remembers which step's weights it
holds, which of its weight loads was which step (token staleness with partial rollouts), and
what the last sync cost.
"""

from __future__ import annotations

from typing import Any

from toolgym.algorithms.engine_choice import shares_servers, sync_weights
from toolgym.algorithms.policy_versions import PolicyVersions


class EngineWeights:
    """The weights `engine` samples with, against `learner`'s.

    Args:
        engine: The rollout engine.
        learner: The policy's owner (`toolgym.algorithms.learner.Learner`).
        accelerator: The run's `Accelerator` (servers shared by processes sync once).
    """

    def __init__(self, engine: Any, learner: Any, accelerator: Any) -> None:
        self.engine, self.learner, self.accelerator = engine, learner, accelerator
        self.step = 0
        """The training step whose weights the engine holds."""
        self.synced = False
        """Whether this object has given the engine weights yet."""
        self.versions = PolicyVersions(engine)
        """Which step's weights each engine version is (token staleness, `partial_rollouts`)."""
        self.figures: dict[str, float] = {}
        """The last sync's `weight_sync_seconds` and `weight_sync_bytes`."""
        self.newest = 0
        """The newest step whose weights the engine holds or is being given (tokens sampled
        during a sync may already be of these)."""

    @property
    def stale_servers(self) -> bool:
        """Whether the engine samples on servers every process shares that were never given
        this run's weights (they may hold another run's)."""
        return not self.synced and shares_servers(self.engine)

    def sync(self, step: int) -> None:
        """Give the engine the learner's weights, which are those of `step` (a collective
        under sharding: every process calls it)."""
        self.newest = max(self.newest, step)
        policy, weights = self.learner.engine_weights()
        self.figures = sync_weights(self.engine, policy, self.accelerator, weights)
        self.step, self.synced = step, True
        self.versions.loaded(step)
