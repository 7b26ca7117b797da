"""From finished trajectories to a policy-gradient update.

`GRPOTrainer` / `RLOOTrainer` run the loop (rollouts, rewards, advantages, update, weight sync);
`advantages`, `losses`, `batch` and `rewards` are its parts, usable on their own; `sft` is the
optional warm-up on environment demonstrations (`warmup_cache` keeps its results); `stages` times
and measures the memory of a run's stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.agents.trajectory import summarize
    from toolgym.algorithms.advantages import group_advantages
    from toolgym.algorithms.batch import TokenBatch, TrainingSample, collate, training_samples
    from toolgym.algorithms.config import GRPOConfig, RLOOConfig, SFTConfig
    from toolgym.algorithms.environments import EnvMixture, EveryRow, episode_factory
    from toolgym.algorithms.grpo import GRPOTrainer
    from toolgym.algorithms.losses import StepNormalizer, masked_nll, policy_loss, token_logprobs
    from toolgym.algorithms.rewards import compute_rewards
    from toolgym.algorithms.rloo import RLOOTrainer
    from toolgym.algorithms.sft import demonstrations, warmup_sft
    from toolgym.algorithms.warmup_cache import default_cache_dir
    from toolgym.runtime.stages import StageClock

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
