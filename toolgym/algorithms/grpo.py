"""`GRPOTrainer`: group-relative policy optimisation of an agent against an environment.

One step: draw rows -> repeat each `num_generations` times -> reset one environment per
rollout with a seed shared by the group -> agent rollouts -> rewards -> advantages -> one
optimizer step over the sampled tokens -> push the weights to the engine. With several
processes (`accelerate launch`), every process draws the same rows, plays its contiguous share
of the rollouts, and the rewards are gathered so that each group's baseline covers all of its
members wherever they ran.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, set_seed

from toolgym.agents.custom import RolloutFn
from toolgym.agents.engines.logs import engine_logs_to_file, engine_logs_to_terminal
from toolgym.agents.images import VisionInputs
from toolgym.agents.subagents import SubAgent
from toolgym.agents.trajectory import outcome, save_jsonl, summarize
from toolgym.algorithms.config import GRPOConfig, SFTConfig, check_trackers
from toolgym.algorithms.credit import assign_credit
from toolgym.algorithms.curriculum import load_curriculum, save_curriculum
from toolgym.algorithms.engine_choice import check_pipelining, make_engine
from toolgym.algorithms.engine_weights import EngineWeights
from toolgym.algorithms.environments import EpisodeFactory, training_environments
from toolgym.algorithms.kept_episodes import KeptEpisodes
from toolgym.algorithms.learner import Learner, load_policy
from toolgym.algorithms.pipeline import pipelined_steps
from toolgym.algorithms.rewards import RewardFunc
from toolgym.algorithms.sampler import Rollouts, Sampler, training_agent
from toolgym.algorithms.tracking import (
    MetricsLog,
    Progress,
    SignalWatch,
    merged_sources,
    plot_rewards,
    step_metrics,
)
from toolgym.runtime.heap import threshold_for_training
from toolgym.runtime.stages import StageClock, StepBudget

Row = dict[str, Any]


class GRPOTrainer:
    """Trains `model` to play `env` with GRPO.

    Args:
        model: A transformers causal LM or a name for `toolgym.agents.models.load_model`
            (e.g. "smollm2-135m").
        env: A registered id, an environment class, a factory returning an instance, or
            several by name (a dict or an `EnvMixture`: rows name theirs in an `env` column).
        train_dataset: Rows (`prompt` plus `reset` arguments): a `datasets.Dataset` or a list.
        reward_funcs: Extra reward functions (see `toolgym.algorithms.rewards`).
        args: The configuration.
        tokenizer: The model's tokenizer (loaded from `model` when it is a name).
        eval_dataset: Rows for `evaluate()` and `eval_steps`.
        env_kwargs: Constructor arguments for the environment when `env` is an id or class.
        engine: A ready engine to use instead of the one `args.engine` names.
        rollout_fn: An async function that plays each episode instead of the chat or inline
            protocol (`toolgym.agents.custom`), in training and evaluation.
        subagents: Tools that hand a task to another episode of the policy
            (`toolgym.agents.subagents.SubAgent`); their samples train with the episode's
            advantage, under their own role.
    """

    def __init__(
        self,
        model: Any,
        env: str | type | Callable[[], Any] | Mapping[str, Any],
        train_dataset: Sequence[Row] | Any,
        reward_funcs: Sequence[RewardFunc] | None = None,
        args: GRPOConfig | None = None,
        tokenizer: Any = None,
        eval_dataset: Sequence[Row] | Any = None,
        env_kwargs: dict[str, Any] | None = None,
        engine: Any = None,
        rollout_fn: RolloutFn | None = None,
        subagents: Sequence[SubAgent] = (),
    ) -> None:
        self.args = args = args or GRPOConfig()
        if args.keep_in_flight and subagents:  # refused before anything loads or starts
            raise ValueError("keep_in_flight does not keep sub-agents' episodes yet")
        self.engine_log = _route_engine_logs(args)
        """Where the engine's log lines go (None: the terminal, `verbose`)."""
        self.stages = StageClock()
        """Wall time and peak memory per stage (model load, warm-up, rollouts, update...)."""
        self.accelerator = _process_setup(args)  # the process group, the seed, the allocator
        self._bars = args.progress_bar and self.accelerator.is_main_process  # progress bars
        model, self.tokenizer = self._policy_and_tokenizer(model, tokenizer)
        self.train_rows = [dict(r) for r in train_dataset]
        self.eval_rows = [dict(r) for r in eval_dataset] if eval_dataset is not None else []
        if not self.train_rows:
            raise ValueError("train_dataset is empty")
        self._make_env = self._env_factory(env, env_kwargs or {})
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else 0
        self.learner = Learner(model, args, self.accelerator, self.pad_id, self.vision)
        """The policy, its optimizer and checkpoints (`toolgym.algorithms.learner`)."""
        self.model = self.learner.model  # as accelerate prepared it
        self.output_dir = Path(args.output_dir)
        self.engine = engine or self._start_engine()
        self.agent = training_agent(args, self.engine, self.tokenizer, self.vision, subagents)
        process = (self.accelerator.process_index, self.accelerator.num_processes)
        self.sampler = Sampler(  # plays and scores episodes; it needs nothing of the learner
            self.agent,
            self._make_env,
            self.train_rows,
            args,
            reward_funcs or [],
            rollout_fn,
            process,
            self.stages,
        )
        self.step, self._last_step_end = 0, 0.0
        self.engine_weights = EngineWeights(self.engine, self.learner, self.accelerator)
        """Which step's weights the engine holds, and its syncs (`engine_weights`)."""
        if args.keep_in_flight:  # episodes kept between turns, for a restart
            self.sampler.kept = KeptEpisodes(self.output_dir / "in-flight", self._newest_weights)
        self.stopped_by = ""
        """Why the last `train()` ended: "max_steps" or the `max_seconds` budget."""
        self.budget = StepBudget(args.max_seconds, 0)
        self.warmup_cached_from: Path | None = None  # the entry the last warmup() loaded
        self.log = MetricsLog(self.output_dir, args.report_to, args.to_dict())
        self._signal = SignalWatch(args.num_generations)  # says once if a step learned nothing
        check_pipelining(args, self.engine)

    def _newest_weights(self) -> int:
        """The newest step whose weights the engine holds or is being given."""
        return self.engine_weights.newest

    def _policy_and_tokenizer(self, model: Any, tokenizer: Any) -> tuple[Any, Any]:
        """The policy (loaded where `model` is a name) and its text tokenizer; a processor's
        image side becomes `vision` (None for a text model)."""
        if isinstance(model, str):
            with self.stages.stage("model load"):
                model, tokenizer = load_policy(model, tokenizer)
        if tokenizer is None:
            raise ValueError("pass the model's tokenizer (tokenizer=...)")
        self.vision = VisionInputs.of(tokenizer, model)  # a processor's image side, or None
        return model, tokenizer.tokenizer if self.vision else tokenizer

    def _start_engine(self) -> Any:
        """The engine `args.engine` names, over the learner's policy."""
        with self.stages.stage("engine start"):
            return make_engine(
                self.args,
                self.learner.engine_policy,
                self.tokenizer,
                self._path("engine-weights"),
                self.eval_rows,
                self.vision,
            )

    # -- the loop ---------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | Path | None = None) -> list[dict[str, Any]]:
        """Run `max_steps` steps (from a checkpoint's step when resuming), or fewer when the
        `max_seconds` budget runs out (`stopped_by` says which); returns the logged metrics of
        every step. Writes the reward plot, `stages.json` and a final checkpoint."""
        if resume_from_checkpoint is not None:
            self.step = self.learner.load(resume_from_checkpoint)
            load_curriculum(self.sampler.curriculum, resume_from_checkpoint)
        if resume_from_checkpoint is not None or self.engine_weights.stale_servers:
            self.engine_weights.sync(self.step)
        if self.sampler.kept is not None:  # the episodes an interrupted run left, if resuming
            self.sampler.kept.start(self.step if resume_from_checkpoint is not None else None)
        self.budget = StepBudget(self.args.max_seconds, self.step)
        self.stopped_by = ""
        history = []
        on_policy = (self.training_step() for _ in iter(self._next_step_fits, False))
        steps = self._pipelined() if self.args.max_staleness else on_policy
        # under a time budget the number of steps is not known in advance
        total = None if self.args.max_seconds is not None else self.args.max_steps
        name = type(self).__name__.removesuffix("Trainer")  # GRPO, RLOO
        with Progress(self._bars, name, total, self.step) as bar:
            for metrics in steps:
                history.append(metrics)
                bar.advance(
                    reward=metrics["reward"],
                    success=metrics["success_rate"],
                    step_s=metrics["step_seconds"],
                )
                self._after_step()
        self.save(self.output_dir / f"checkpoint-{self.step}")
        if self.accelerator.is_main_process:
            with self.stages.stage("plot"):
                plot_rewards(self.log.history(), self.output_dir / "rewards.png")
            self.stages.save(self.output_dir / "stages.json")
        return history

    def _after_step(self) -> None:
        """Evaluate and save where `eval_steps` and `save_steps` ask for it."""
        args = self.args
        if args.eval_steps and self.eval_rows and self.step % args.eval_steps == 0:
            summary = self.evaluate()
            env = summary.pop("env")
            self._log(
                {f"eval/{k}": v for k, v in summary.items()}
                | {f"eval/env/{k}": v for k, v in env.items()}
            )
        if args.save_steps and self.step % args.save_steps == 0:
            self.save(self.output_dir / f"checkpoint-{self.step}")

    def _next_step_fits(self) -> bool:
        """Whether the learner starts another step; records in `stopped_by` why not."""
        if self.step >= self.args.max_steps:
            self.stopped_by = "max_steps"
            return False
        self.stopped_by = self.budget.over(self.step, self.step, self.learner.gather)
        return not self.stopped_by

    def _env_factory(self, env: Any, kwargs: dict[str, Any]) -> EpisodeFactory:
        """What makes one rollout's environment (`toolgym.algorithms.environments`)."""
        per_step = self.args.prompts_per_step * self.args.num_generations
        share = max(1, per_step // self.accelerator.num_processes)
        most = share * self.args.steps_in_flight() + len(self.eval_rows)
        make, self.env_pool = training_environments(env, kwargs, self.args, share, most)
        if self.env_pool is not None:  # the actors go with the trainer, or at exit
            self._pool_finalizer = weakref.finalize(self, self.env_pool.close)
        return make

    def close(self) -> None:
        """Stop what the trainer started outside this process: the warm sandbox pool of
        `sandbox="ray"` (its actors). Safe to call twice; the engine is the caller's."""
        if self.env_pool is not None:
            self._pool_finalizer()

    def training_step(self) -> dict[str, Any]:
        """One step: rollouts, rewards, advantages, update, weight sync; returns metrics."""
        return self._learn(self.sampler.play(self.step, self.engine_weights.step))

    @property
    def make_env(self) -> EpisodeFactory:
        """What makes (or leases) one episode's environment: a function of its row and seed
        (`toolgym.algorithms.environments.EpisodeFactory`)."""
        return self.sampler.make_env

    @make_env.setter
    def make_env(self, factory: EpisodeFactory) -> None:
        self._make_env = self.sampler.make_env = factory

    def _learn(self, rollouts: Rollouts) -> dict[str, Any]:
        """Advantages, the update, the weight sync and the step's metrics, for one batch."""
        trajectories, share = rollouts.trajectories, rollouts.share
        staleness = self.step - rollouts.policy_version  # updates since its weights
        versions = self.engine_weights.versions.step_figures(
            trajectories, self.step, rollouts.policy_version, self.learner.gather
        )
        credit = assign_credit(trajectories, share, self.args, self.learner.gather)
        update_started = time.perf_counter()
        with self.stages.stage("update"):
            loss_stats = self.learner.update(
                trajectories,
                credit.advantages[share],
                credit.used[share],
                int(credit.used.sum()),
                turn_credit=credit.tokens,
            )
        self.step += 1
        with self.stages.stage("weight sync"):
            self.engine_weights.sync(self.step)
        if self.sampler.kept is not None:  # learned and synced: nothing of it to go on from
            self.sampler.kept.learned(self.step - 1)
        outcomes = self.learner.gather([outcome(t) for t in trajectories])
        sources = merged_sources(self.learner.gather([rollouts.sources]))
        logged = self.learner.gather([rollouts.reward_metrics])  # TRL's log_metric values
        metrics = step_metrics(credit.everyone, outcomes, sources, credit.used, self.args, logged)
        self._signal.check(self.step, metrics, self.accelerator.is_main_process)
        metrics.update(loss_stats | self.engine_weights.figures | rollouts.figures | versions)
        if (curriculum := self.sampler.curriculum) is not None:  # every process sees the same
            curriculum.observe(metrics["success_rate"])
            metrics["curriculum_moves"] = curriculum.moves
        metrics.update(
            rollout_seconds=rollouts.seconds,
            update_seconds=time.perf_counter() - update_started,
            step_seconds=time.perf_counter() - max(rollouts.started, self._last_step_end),
            learning_rate=self.learner.learning_rate,
            staleness=staleness,
        )
        self._last_step_end = time.perf_counter()
        if self.step % self.args.logging_steps == 0:
            self._log(metrics)
        if self.args.save_samples and self.accelerator.is_main_process:
            for trajectory in trajectories:
                trajectory.metrics["step"] = self.step
            save_jsonl(trajectories, self._path("samples.jsonl"), append=True)
        return metrics

    def _pipelined(self) -> Iterator[dict[str, Any]]:
        """Steps whose rollouts are played while earlier updates run (`max_staleness`)."""

        def play(step: int) -> Rollouts | str:
            # with several processes only the learner asks (each must stop at the same step)
            over = (
                self.budget.over(step, self.step, self.learner.gather)
                if self.accelerator.num_processes == 1
                else ""
            )
            return over or self.sampler.play(step, self.engine_weights.step)

        return pipelined_steps(
            range(self.step, self.args.max_steps),
            self.args.max_staleness,
            lambda: self.engine_weights.step,
            play,
            self._learn,
            self._next_step_fits,
            functools.partial(setattr, self, "stopped_by"),
            overlap=self.args.partial_rollouts,
        )

    # -- evaluation, warm-up, saving ----------------------------------------------------------
    def evaluate(
        self,
        rows: Sequence[Row] | None = None,
        temperature: float = 0.0,
        samples_file: str | None = None,
        seed: int | None = None,
    ) -> dict:
        """Play each row once (greedy by default); returns mean reward, success rate, turns,
        tool calls, valid tool calls and status counts. With `samples_file`, the episodes are
        also written to that file in `output_dir` (JSONL trajectories, replacing it).

        With `seed`, sampling is seeded per game and turn (`SamplingParams.seed`): two
        evaluations of the same rows with the same seed draw the same random numbers, so
        their game-by-game difference measures what changed in the weights with less noise
        (common random numbers)."""
        rows = [dict(r) for r in (rows if rows is not None else self.eval_rows)]
        if not rows:
            raise ValueError("no evaluation rows (pass eval_dataset or rows)")
        # the settings go to this run only: training rollouts in flight keep theirs
        trajectories = self.sampler.evaluate(rows, temperature, seed)
        if samples_file and self.accelerator.is_main_process:
            save_jsonl(trajectories, self._path(samples_file))
        return summarize(trajectories, self.args.success_threshold)

    def warmup(
        self,
        rows: Sequence[Row],
        config: SFTConfig | None = None,
        cache_dir: str | Path | None = None,
    ) -> list[float]:
        """Supervised warm-up on the environment's demonstrations of `rows` (optional; for
        models that cannot call tools yet); returns the loss of each step.

        With `cache_dir` (e.g. `toolgym.algorithms.default_cache_dir()`), a warm-up of the same
        starting weights on the same demonstrations with the same settings is loaded from there
        instead of being trained again, and a new one is stored; `warmup_cached_from` then
        names the entry that was loaded (None when the warm-up ran). With several processes
        the cache is not used (they could disagree on a hit and start from different weights).
        """
        config = config or SFTConfig()
        with self.stages.stage("demonstrations"):
            demos = self.sampler.demonstrations(rows)
        if self.accelerator.num_processes > 1:
            cache_dir = None  # each process would decide alone whether it hits
        steps = config.epochs * -(-len(demos) // config.batch_size)
        with Progress(self._bars, "warm-up", steps) as bar:
            losses, self.warmup_cached_from = self.learner.warm_up(
                demos,
                config,
                None if cache_dir is None else Path(cache_dir),
                self.stages,
                on_step=lambda _, loss: bar.advance(loss=loss),
            )
        with self.stages.stage("weight sync"):
            self.engine_weights.sync(self.step)
        return losses

    def save(self, folder: str | Path) -> Path | None:
        """A checkpoint: the main process writes the model, optimizer and schedule; every
        process writes its own random states (each samples with its own seed)."""
        with self.stages.stage("checkpoint"):
            saved = self.learner.save(folder, self.tokenizer, self.step)
        if saved is not None:  # the main process's
            save_curriculum(self.sampler.curriculum, saved)
        return saved

    def _path(self, name: str) -> Path:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return self.output_dir / name

    def _log(self, metrics: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            self.log.log(self.step, metrics)


def _process_setup(args: GRPOConfig) -> Accelerator:
    """This process's part of a run: its `Accelerator` (`cpu=True` without CUDA, so the ranks
    of `accelerate launch --multi_gpu` join one gloo group; collectives time out after
    `distributed_timeout`), its seed, and the allocator's mmap threshold (`mmap_threshold`);
    first, the trackers `report_to` names must be installed (`check_trackers`)."""
    check_trackers(args.report_to)  # a missing package is named before anything loads
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=args.distributed_timeout))
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=[timeout])
    threshold_for_training(args.mmap_threshold, accelerator.device.type)
    set_seed(args.seed + accelerator.process_index)
    return accelerator


def _route_engine_logs(args: GRPOConfig) -> Path | None:
    """The engine's log lines to `output_dir/engine.log` (its path), or, with `verbose`, to
    the terminal (None), undoing what an earlier trainer in this process set."""
    if args.verbose:
        engine_logs_to_terminal()
        return None
    return engine_logs_to_file(args.engine_log_path)
