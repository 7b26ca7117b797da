"""The sampler: the part of training that plays and scores episodes.

It needs nothing of the learner (no model, optimizer or loss): an agent (engine, tokenizer,
parser, limits), what makes one rollout's environment, the rows, and how episodes are
scored. Each step's rows are drawn from a seeded shuffle (a resumed run draws the same), every
row is played `num_generations` times from one reset seed (a GRPO group), and this process
plays its share. Sampling settings go with each run, so an evaluation never changes what
training rollouts in flight sample with. `GRPOTrainer` orchestrates a sampler and the learner;
the cluster work places samplers beside the environments and engines.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.agents.custom import RolloutFn
from toolgym.agents.engines.base import SamplingParams
from toolgym.agents.rollout import Agent
from toolgym.agents.subagents import SubAgent
from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.config import GRPOConfig
from toolgym.algorithms.curriculum import Curriculum
from toolgym.algorithms.dynamic_sampling import Played, extra_rows, fill_with_signal, split
from toolgym.algorithms.environments import EpisodeFactory
from toolgym.algorithms.kept_episodes import KeptEpisodes
from toolgym.algorithms.rewards import (
    RewardFunc,
    RewardLogs,
    compute_rewards,
    has_own_step_rewards,
    step_reward_total,
)
from toolgym.algorithms.sft import demonstrations
from toolgym.algorithms.tree_rollouts import play_trees
from toolgym.envs.calls import close_all
from toolgym.runtime.stages import StageClock

Row = dict[str, Any]


@dataclass
class Rollouts:
    """One step's played and scored episodes (this process's share), before the update."""

    trajectories: list[Trajectory]
    sources: dict[str, list[float]]
    share: list[int]
    policy_version: int
    """The step whose weights the engine sampled from (later turns may use newer ones)."""
    started: float
    seconds: float
    reward_metrics: dict[str, list[float]] = field(default_factory=dict)
    """Values reward functions logged with TRL's `log_metric(name, value)`, by name."""
    figures: dict[str, float] = field(default_factory=dict)
    """The sampler's figures for the step's metrics: the curriculum's level, dynamic
    sampling's rounds and groups (none when both are off)."""


class Sampler:
    """Plays and scores a training step's episodes, or an evaluation's.

    Args:
        agent: Plays the episodes (its engine samples with the policy's current weights).
        make_env: Makes (or leases) one episode's environment from its row and seed
            (`toolgym.algorithms.environments`); closed after the episode.
        train_rows: The dataset rows training draws from.
        args: The run's configuration (rows per step, group size, seed, scoring).
        reward_funcs: Extra reward functions (see `toolgym.algorithms.rewards`).
        rollout_fn: Plays each episode instead of the built-in protocols.
        process: (this process's index, the number of processes) sharing each step.
        stages: Times the rollouts and evaluations.
    """

    def __init__(
        self,
        agent: Agent,
        make_env: EpisodeFactory,
        train_rows: Sequence[Row],
        args: GRPOConfig,
        reward_funcs: Sequence[RewardFunc] = (),
        rollout_fn: RolloutFn | None = None,
        process: tuple[int, int] = (0, 1),
        stages: StageClock | None = None,
    ) -> None:
        if not train_rows:
            raise ValueError("train_dataset is empty")
        if args.dynamic_sampling and process[1] > 1:
            raise ValueError(
                "dynamic_sampling runs on one process for now (the groups it keeps would have "
                "to move between processes); run one process or set dynamic_sampling=False"
            )
        if args.keep_in_flight and (process[1] > 1 or rollout_fn is not None):
            raise ValueError(
                "keep_in_flight runs on one process and with the chat protocol (no rollout_fn "
                "of its own) for now"
            )
        if args.branch_at_turn and (process[1] > 1 or rollout_fn is not None):
            raise ValueError(
                "branch_at_turn (tree rollouts) runs on one process and with the built-in "
                "protocols (no rollout_fn of its own) for now"
            )
        self.agent, self.make_env, self.args = agent, make_env, args
        self.train_rows = list(train_rows)
        self.reward_funcs = list(reward_funcs)
        self.rollout_fn = rollout_fn
        self.process_index, self.num_processes = process
        self.stages = stages or StageClock()
        self._order: tuple[int, list[int]] = (-1, [])
        self.curriculum = (
            Curriculum(
                self.train_rows,
                args.curriculum_window,
                args.curriculum_promote_at,
                args.curriculum_demote_at,
                args.seed,
            )
            if args.curriculum
            else None
        )
        """The difficulty curriculum, where `args.curriculum` asks for one."""
        self.kept: KeptEpisodes | None = None
        """Where episodes are kept between turns (`keep_in_flight`; the trainer sets it)."""

    def play(self, step: int, policy_version: int) -> Rollouts:
        """Play and score step `step`'s episodes (this process's share) with the engine's
        current weights (those of update `policy_version`); with `dynamic_sampling`, groups
        without signal are replaced by groups of extra rounds
        (`toolgym.algorithms.dynamic_sampling`)."""
        started = time.perf_counter()
        figures: dict[str, float] = {}
        rows, seeds = self.step_rows(step)
        if self.curriculum is not None:  # the level these rows were drawn at
            figures["curriculum_level"] = float(rows[0]["difficulty"])
        trajectories, sources, logged, finished = self._play(rows, seeds, step)
        if self.args.dynamic_sampling:
            group = self.args.num_generations

            def play_round(round_: int) -> Played:
                rows, seeds = extra_rows(
                    self.train_rows, self.args.prompts_per_step, self.args.seed, step, round_
                )
                if self.curriculum is not None:  # fresh rows of the level being trained
                    rows = self.curriculum.draw(len(rows))
                played = self._play(
                    [r for r in rows for _ in range(group)],
                    [s for s in seeds for _ in range(group)],
                    step,
                )
                return split(played[0], played[1], group, played[2])

            trajectories, sources, logged, dynamic = fill_with_signal(
                split(trajectories, sources, group, logged),
                play_round,
                self.args.prompts_per_step,
                self.args.dynamic_sampling_rounds,
                self.args.mask_truncated,
                self.args.step_rewards == "tokens",
            )
            figures.update(dynamic)
            finished = time.perf_counter()
        return Rollouts(
            trajectories,
            sources,
            self.share(self.args.prompts_per_step * self.args.num_generations),
            policy_version,
            started,
            finished - started,
            logged,
            figures,
        )

    def _play(
        self, rows: list[Row], seeds: list[int], step: int
    ) -> tuple[list[Trajectory], dict[str, list[float]], dict[str, list[float]], float]:
        """Play and score this process's share of `rows`: the trajectories, the per-source
        rewards, the values reward functions logged, and when the rollouts ended."""
        share = self.share(len(rows))
        mine = [dict(rows[i]) for i in share]  # a mixture writes each one's `env` in it
        envs: list[Any] = []
        try:  # the environments (sandboxes, containers) close on every path
            envs.extend(self.make_env(row, seeds[i]) for row, i in zip(mine, share, strict=True))
            with self.stages.stage("rollouts"):
                played = envs
                if self.args.branch_at_turn:  # groups as trees: forks replace the members
                    trajectories, played = play_trees(
                        self.agent,
                        envs,
                        mine,
                        [seeds[i] for i in share],
                        self.args.tree_size or self.args.num_generations,
                        self.args.branch_at_turn,
                        train_shared=(self.args.tree_size or self.args.num_generations)
                        < self.args.num_generations,
                    )
                    envs.extend(env for env in played if env not in envs)
                elif self.kept is not None:  # kept after every turn, resumed where kept
                    trajectories = self.kept.play(
                        self.agent, envs, mine, [seeds[i] for i in share], step
                    )
                else:
                    trajectories = self.agent.run(
                        envs, mine, [seeds[i] for i in share], rollout_fn=self.rollout_fn
                    )
            finished = time.perf_counter()
            logs = RewardLogs()
            sources = self._score(trajectories, mine, played, self.trainer_state(step), logs)
        finally:
            close_all(envs)
        return trajectories, sources, logs.metrics, finished

    def trainer_state(self, step: int) -> Any:
        """A `transformers.TrainerState` for reward functions that read TRL's `trainer_state`:
        the steps done (`global_step`), `max_steps` and the epochs of the dataset seen."""
        from transformers import TrainerState

        per_step = self.args.prompts_per_step
        return TrainerState(
            global_step=step,
            max_steps=self.args.max_steps,
            epoch=step * per_step / len(self.train_rows),
            train_batch_size=per_step * self.args.num_generations,
        )

    def evaluate(
        self, rows: Sequence[Row], temperature: float = 0.0, seed: int | None = None
    ) -> list[Trajectory]:
        """Play each row once, reset with seed = its index, sampling at `temperature` (greedy
        by default) for these episodes only; with `seed`, each episode's sampling is seeded
        from it, its index and the turn (`SamplingParams.seed`)."""
        sampling = SamplingParams(temperature=temperature, top_p=1.0, seed=seed)
        rows = [dict(r) for r in rows]
        envs: list[Any] = []
        try:
            envs.extend(self.make_env(r, i) for i, r in enumerate(rows))
            with self.stages.stage("evaluation"):
                return self.agent.run(
                    envs,
                    rows,
                    list(range(len(rows))),
                    rollout_fn=self.rollout_fn,
                    sampling=sampling,
                )
        finally:
            close_all(envs)

    def demonstrations(self, rows: Sequence[Row]) -> list[Trajectory]:
        """The environment's expert episodes of `rows` (seed = each row's index), rendered
        as the agent renders its own (template, parser, per-turn samples), for a warm-up."""
        renderer = self.agent.renderer
        return demonstrations(
            self.make_env,
            [dict(r) for r in rows],
            renderer.tokenizer,
            seeds=list(range(len(rows))),
            parser=self.args.parser,
            chat_template_kwargs=self.args.chat_template_kwargs,
            template_profile=renderer.profile,  # the same template, training one included
        )

    def step_rows(self, step: int) -> tuple[list[Row], list[int]]:
        """Step `step`'s rows, each repeated `num_generations` times, and one seed per group
        (with a curriculum, the current level's next rows: drawing advances it)."""
        count, group = self.args.prompts_per_step, self.args.num_generations
        if self.curriculum is not None:
            drawn = self.curriculum.draw(count)
        else:
            drawn = []
            for slot in range(count):
                epoch, position = divmod(step * count + slot, len(self.train_rows))
                drawn.append(dict(self.train_rows[self._epoch_order(epoch)[position]]))
        rows: list[Row] = []
        seeds: list[int] = []
        for slot, row in enumerate(drawn):
            seed = (self.args.seed * 1_000_003 + step * count + slot) % 2**31
            rows.extend(dict(row) for _ in range(group))
            seeds.extend([seed] * group)
        return rows, seeds

    def share(self, total: int) -> list[int]:
        """The indices of a step's `total` episodes that this process plays."""
        processes, me = self.num_processes, self.process_index
        if total % processes:
            raise ValueError(f"{total} rollouts per step do not split over {processes} processes")
        size = total // processes
        return list(range(me * size, (me + 1) * size))

    def _epoch_order(self, epoch: int) -> list[int]:
        """The dataset's shuffled order in `epoch` (seeded, so a resumed run sees the same)."""
        if self._order[0] != epoch:
            order = list(range(len(self.train_rows)))
            random.Random(self.args.seed * 7919 + epoch).shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def _score(
        self,
        trajectories: list[Trajectory],
        rows: list[Row],
        envs: list[Any],
        trainer_state: Any = None,
        logs: RewardLogs | None = None,
    ) -> dict[str, list[float]]:
        """Each trajectory's total reward and its sources (also returned, per source); what
        the reward functions log goes to `logs` (`log_extra` values onto the trajectories)."""
        args, logs = self.args, logs if logs is not None else RewardLogs()
        rewards, sources = compute_rewards(
            trajectories,
            rows,
            envs,
            self.reward_funcs,
            args.reward_weights,
            args.env_reward,
            trainer_state=trainer_state,
            logs=logs,
            model_failure_reward=args.limits.model_failure_reward,
        )
        for column, values in logs.extras.items():
            for trajectory, value in zip(trajectories, values, strict=False):
                trajectory.extras[column] = value
        if any(t.step_rewards for t in trajectories):
            sources["step_rewards"] = [step_reward_total(t) for t in trajectories]
            if args.step_rewards == "return":
                rewards = [
                    (s if has_own_step_rewards(t) else None) if r is None else r + s
                    for r, s, t in zip(rewards, sources["step_rewards"], trajectories, strict=True)
                ]
        for index, (trajectory, reward) in enumerate(zip(trajectories, rewards, strict=True)):
            trajectory.reward = reward
            trajectory.reward_sources = {
                name: None if math.isnan(values[index]) else values[index]
                for name, values in sources.items()
            }
        return sources


def training_agent(
    args: GRPOConfig,
    engine: Any,
    tokenizer: Any,
    vision: Any = None,
    subagents: Sequence[SubAgent] = (),
) -> Agent:
    """The agent playing a run's rollouts: the engine, the template choices, the limits, the
    training sampling settings and the sub-agents; images in tool results reach the model
    through `vision` with the transformers engine only."""
    return Agent(
        engine,
        tokenizer,
        parser=args.parser,
        chat_template=args.chat_template,
        chat_template_kwargs=args.chat_template_kwargs,
        per_turn=args.per_turn,
        limits=args.limits,
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p),
        batch_wait=args.batch_wait,
        vision=vision if getattr(engine, "vision", None) is not None else None,
        compaction=args.compaction(),
        subagents=tuple(subagents),
    )
