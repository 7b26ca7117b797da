"""`GRPOTrainer`: group-relative policy optimisation of an agent against an environment.

One step: draw rows -> repeat each `num_generations` times -> reset one environment per
rollout with a seed shared by the group -> agent rollouts -> rewards -> advantages -> one
optimizer step over the sampled tokens -> push the weights to the engine. With several
processes (`accelerate launch`), every process draws the same rows, plays its contiguous share
of the rollouts, and the rewards are gathered so that each group's baseline covers all of its
members wherever they ran.
"""

from __future__ import annotations

import copy
import functools
import math
import queue
import statistics
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, set_seed
from transformers import get_scheduler

import toolgym
from toolgym.agents.custom import RolloutFn
from toolgym.agents.engines.base import SamplingParams, capabilities
from toolgym.agents.engines.hf import HFEngine
from toolgym.agents.engines.logs import engine_logs_to_file, engine_logs_to_terminal
from toolgym.agents.rollout import Agent
from toolgym.agents.trajectory import Trajectory, outcome, save_jsonl, summarize
from toolgym.algorithms.advantages import group_advantages
from toolgym.algorithms.batch import collate, training_samples
from toolgym.algorithms.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    save_random_states,
)
from toolgym.algorithms.config import GRPOConfig, SFTConfig
from toolgym.algorithms.losses import (
    StepNormalizer,
    compile_by_default,
    policy_loss,
    token_logprobs,
)
from toolgym.algorithms.rewards import (
    RewardFunc,
)
from toolgym.algorithms.sampler import Rollouts, Sampler
from toolgym.algorithms.sft import demonstrations, warmup_sft
from toolgym.algorithms.stages import StageClock
from toolgym.algorithms.tracking import MetricsLog, plot_rewards
from toolgym.algorithms.warmup_cache import load_warmup, store_warmup, warmup_key
from toolgym.algorithms.weights import policy_state_dict, save_policy

Row = dict[str, Any]


class GRPOTrainer:
    """Trains `model` to play `env` with GRPO.

    Args:
        model: A transformers causal LM or a name for `toolgym.agents.models.load_model`
            (e.g. "smollm2-135m").
        env: A registered id, an environment class, or a factory returning an instance.
        train_dataset: Rows (`prompt` plus `reset` arguments): a `datasets.Dataset` or a list.
        reward_funcs: Extra reward functions (see `toolgym.algorithms.rewards`).
        args: The configuration.
        tokenizer: The model's tokenizer (loaded from `model` when it is a name).
        eval_dataset: Rows for `evaluate()` and `eval_steps`.
        env_kwargs: Constructor arguments for the environment when `env` is an id or class.
        engine: A ready engine to use instead of the one `args.engine` names.
        rollout_fn: An async function that plays each episode instead of the chat or inline
            protocol (`toolgym.agents.custom`), in training and evaluation.
    """

    def __init__(
        self,
        model: Any,
        env: str | type | Callable[[], Any],
        train_dataset: Sequence[Row] | Any,
        reward_funcs: Sequence[RewardFunc] | None = None,
        args: GRPOConfig | None = None,
        tokenizer: Any = None,
        eval_dataset: Sequence[Row] | Any = None,
        env_kwargs: dict[str, Any] | None = None,
        engine: Any = None,
        rollout_fn: RolloutFn | None = None,
    ) -> None:
        self.args = args = args or GRPOConfig()
        self.engine_log = _route_engine_logs(args)
        """Where the engine's log lines go (None: the terminal, `verbose`)."""
        self.rollout_fn = rollout_fn  # plays episodes in training and evaluation alike
        self.stages = StageClock()
        """Wall time and peak memory per stage (model load, warm-up, rollouts, update...)."""
        # cpu=True on a machine without CUDA makes processes started by torchrun or
        # `accelerate launch --multi_gpu` join one gloo group (otherwise each runs alone).
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
        set_seed(args.seed + self.accelerator.process_index)
        if isinstance(model, str):
            from toolgym.agents.models import load_model, load_tokenizer

            with self.stages.stage("model load"):
                tokenizer = tokenizer or load_tokenizer(model)
                model = load_model(model)
        if tokenizer is None:
            raise ValueError("pass the model's tokenizer (tokenizer=...)")
        self.tokenizer = tokenizer
        self.train_rows = [dict(r) for r in train_dataset]
        self.eval_rows = [dict(r) for r in eval_dataset] if eval_dataset is not None else []
        if not self.train_rows:
            raise ValueError("train_dataset is empty")
        self._make_env = self._env_factory(env, env_kwargs or {})
        self.reward_funcs = list(reward_funcs or [])
        if args.lora is not None:
            model = _with_lora(model, args.lora)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = _frozen_copy(model) if args.beta > 0 else None
        optimizer = self._make_optimizer(model)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.output_dir = Path(args.output_dir)
        with self.stages.stage("engine start"):
            self.engine = engine or self._make_engine()
        self.agent = self._make_agent()
        self.sampler = self._make_sampler(rollout_fn)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.step = 0
        self._engine_version = 0  # the step whose weights the engine samples from
        self._last_step_end = 0.0
        self.stopped_by = ""
        """Why the last `train()` ended: "max_steps" or the `max_seconds` budget."""
        self._train_started, self._train_first_step = 0.0, 0
        self.warmup_cached_from: Path | None = None  # the entry the last warmup() loaded
        self.log = MetricsLog(self.output_dir, args.report_to, args.to_dict())
        self._check_pipelining()

    def _make_sampler(self, rollout_fn: RolloutFn | None) -> Sampler:
        """The part that plays and scores episodes; it needs nothing of the learner (model,
        optimizer, loss)."""
        return Sampler(
            self.agent,
            self._make_env,
            self.train_rows,
            self.args,
            self.reward_funcs,
            rollout_fn,
            (self.accelerator.process_index, self.accelerator.num_processes),
            self.stages,
        )

    def _check_pipelining(self) -> None:
        """Refuse `max_staleness` with an engine that shares the policy's weights."""
        if self.args.max_staleness and not capabilities(self.engine).own_weights:
            raise ValueError(
                "max_staleness > 0 plays rollouts while the update runs, which needs an engine "
                "with its own copy of the weights: engine='vllm' or 'vllm-server'"
            )

    def _make_optimizer(self, model: Any) -> torch.optim.Optimizer:
        """AdamW over the trainable parameters, and its learning-rate schedule."""
        args = self.args
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=args.learning_rate,
            betas=args.adam_betas,
            weight_decay=args.weight_decay,
        )
        self.scheduler = get_scheduler(
            args.lr_scheduler, optimizer, args.warmup_steps, args.max_steps
        )
        return optimizer

    # -- the loop ---------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | Path | None = None) -> list[dict[str, Any]]:
        """Run `max_steps` steps (from a checkpoint's step when resuming), or fewer when the
        `max_seconds` budget runs out (`stopped_by` says which); returns the logged metrics of
        every step. Writes the reward plot, `stages.json` and a final checkpoint."""
        if resume_from_checkpoint is not None:
            self.step = load_checkpoint(
                resume_from_checkpoint,
                self._unwrapped,
                self.optimizer,
                self.scheduler,
                rank=self.accelerator.process_index,
            )
            self._sync_engine()
        # under a time budget the number of steps is not known in advance
        bar = self._progress(
            type(self).__name__.removesuffix("Trainer"),  # GRPO, RLOO
            None if self.args.max_seconds is not None else self.args.max_steps,
            self.step,
        )
        self._train_started, self._train_first_step = time.perf_counter(), self.step
        self.stopped_by = ""
        history = []
        steps = self._pipelined() if self.args.max_staleness else self._on_policy()
        for metrics in steps:
            history.append(metrics)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['reward']:.3f}",
                    success=f"{metrics['success_rate']:.0%}",
                    step_s=f"{metrics['step_seconds']:.1f}",
                )
            if self.args.eval_steps and self.eval_rows and self.step % self.args.eval_steps == 0:
                summary = self.evaluate()
                env = summary.pop("env")
                self._log(
                    {f"eval/{k}": v for k, v in summary.items()}
                    | {f"eval/env/{k}": v for k, v in env.items()}
                )
            if self.args.save_steps and self.step % self.args.save_steps == 0:
                self.save(self.output_dir / f"checkpoint-{self.step}")
        if bar is not None:
            bar.close()
        self.save(self.output_dir / f"checkpoint-{self.step}")
        if self.accelerator.is_main_process:
            with self.stages.stage("plot"):
                plot_rewards(self.log.history(), self.output_dir / "rewards.png")
            self.stages.save(self.output_dir / "stages.json")
        return history

    def _on_policy(self) -> Iterator[dict[str, Any]]:
        while self._next_step_fits():
            yield self.training_step()

    def _next_step_fits(self) -> bool:
        """Whether the learner starts another step; records in `stopped_by` why not."""
        if self.step >= self.args.max_steps:
            self.stopped_by = "max_steps"
            return False
        over = self._over_budget(self.step)
        if over:
            self.stopped_by = over
        return not over

    def _over_budget(self, step: int) -> str:
        """Why step `step` would end past `max_seconds` at the mean step time so far ("" if it
        would not, or there is no budget). Every process sees the slowest one's clock, so all
        stop at the same step; with several processes a pipelined producer does not ask (its
        rollouts may then run up to `max_staleness` steps past the budget)."""
        budget, done = self.args.max_seconds, self.step - self._train_first_step
        if budget is None or done == 0:
            return ""
        elapsed = time.perf_counter() - self._train_started
        if self.accelerator.num_processes > 1:  # only the learner asks then (one thread)
            elapsed = max(self._gather([elapsed]))
        if elapsed + elapsed / done * (step - self.step + 1) > budget:
            return f"max_seconds ({budget:.0f} s): {done} steps in {elapsed:.0f} s"
        return ""

    def _env_factory(self, env: Any, kwargs: dict[str, Any]) -> Callable[[], Any]:
        """What makes one rollout's environment: a lease of a warm Ray pool for
        `sandbox="ray"`, else a fresh instance placed by `sandbox`."""
        self.env_pool: Any = None  # the warm SandboxPool of sandbox="ray"; close() stops it
        if self.args.sandbox != "ray":
            return _env_factory(env, kwargs, self.args.sandbox)
        share, most = self._episodes_at_once()
        self.env_pool = _ray_pool(env, kwargs, self.args, share, most)
        # the actors go when the trainer does, or at exit if nobody called close()
        self._pool_finalizer = weakref.finalize(self, self.env_pool.close)
        return self.env_pool.lease

    def close(self) -> None:
        """Stop what the trainer started outside this process: the warm sandbox pool of
        `sandbox="ray"` (its actors). Safe to call twice; the engine is the caller's."""
        if self.env_pool is not None:
            self._pool_finalizer()

    def _episodes_at_once(self) -> tuple[int, int]:
        """This process's share of a step's episodes, and the most environments it holds at
        once (a step's share, plus an evaluation's rows while a pipelined producer plays)."""
        per_step = self.args.prompts_per_step * self.args.num_generations
        share = max(1, per_step // self.accelerator.num_processes)
        return share, share + len(self.eval_rows)

    def training_step(self) -> dict[str, Any]:
        """One step: rollouts, rewards, advantages, update, weight sync; returns metrics."""
        return self._learn(self._rollouts(self.step))

    def _rollouts(self, step: int) -> Rollouts:
        """Step `step`'s episodes, played and scored by the sampler with the engine's current
        weights."""
        return self.sampler.play(step, self._engine_version)

    @property
    def make_env(self) -> Callable[[], Any]:
        """What makes (or leases) one rollout's environment."""
        return self.sampler.make_env

    @make_env.setter
    def make_env(self, factory: Callable[[], Any]) -> None:
        self._make_env = self.sampler.make_env = factory

    def _learn(self, rollouts: Rollouts) -> dict[str, Any]:
        """Advantages, the update, the weight sync and the step's metrics, for one batch."""
        trajectories, share = rollouts.trajectories, rollouts.share
        staleness = self.step - rollouts.policy_version  # updates since its weights
        everyone = self._gather([(t.reward, self._valid(t)) for t in trajectories])
        advantages, used = group_advantages(
            [r for r, _ in everyone],
            [v for _, v in everyone],
            self.args.num_generations,
            baseline=self.args.advantage,
            scale=self.args.scale_rewards,
        )
        update_started = time.perf_counter()
        with self.stages.stage("update"):
            loss_stats = self._update(trajectories, advantages[share], used[share], int(used.sum()))
        self.step += 1
        with self.stages.stage("weight sync"):
            self._sync_engine()
        metrics = self._step_metrics(everyone, trajectories, rollouts.sources, used)
        metrics.update(loss_stats)
        metrics.update(
            rollout_seconds=rollouts.seconds,
            update_seconds=time.perf_counter() - update_started,
            step_seconds=time.perf_counter() - max(rollouts.started, self._last_step_end),
            learning_rate=self.scheduler.get_last_lr()[0],
            staleness=staleness,
        )
        self._last_step_end = time.perf_counter()
        if self.step % self.args.logging_steps == 0:
            self._log(metrics)
        if self.args.save_samples and self.accelerator.is_main_process:
            for trajectory in trajectories:
                trajectory.metrics.update(step=self.step, staleness=staleness)
            save_jsonl(trajectories, self._path("samples.jsonl"), append=True)
        return metrics

    def _pipelined(self) -> Iterator[dict[str, Any]]:
        """Steps whose rollouts are played while earlier updates run: the rollouts of step n
        start once update n - max_staleness is done, so no sample is more than
        `max_staleness` updates old when it is learned from."""
        batches: queue.Queue[Rollouts | BaseException | str] = queue.Queue()
        updated = threading.Condition()
        stop = threading.Event()

        def engine_caught_up(step: int) -> bool:
            return self._engine_version >= step - self.args.max_staleness or stop.is_set()

        def produce() -> None:
            try:
                for step in range(self.step, self.args.max_steps):
                    with updated:
                        updated.wait_for(  # the engine has the weights of that update
                            functools.partial(engine_caught_up, step)
                        )
                    if stop.is_set():
                        return
                    over = self._over_budget(step) if self.accelerator.num_processes == 1 else ""
                    if over:  # not worth playing: the learner stops here
                        batches.put(over)
                        return
                    batches.put(self._rollouts(step))
            except BaseException as error:  # handed to the learner, which raises it
                batches.put(error)

        producer = threading.Thread(target=produce, name="toolgym-rollouts", daemon=True)
        producer.start()
        try:
            while self._next_step_fits():
                batch = batches.get()
                if isinstance(batch, BaseException):
                    raise batch
                if isinstance(batch, str):  # the producer found the budget spent
                    self.stopped_by = batch
                    break
                metrics = self._learn(batch)
                with updated:
                    updated.notify_all()
                yield metrics
        finally:
            stop.set()
            with updated:
                updated.notify_all()
            producer.join()

    # -- pieces -----------------------------------------------------------------------------
    def _gather(self, items: list[Any]) -> list[Any]:
        return gather_object(items) if self.accelerator.num_processes > 1 else items

    def _valid(self, trajectory: Trajectory) -> bool:
        if trajectory.failed or not any(s.completion_ids for s in trajectory.samples):
            return False
        return not (self.args.mask_truncated and trajectory.status in ("length", "max_turns"))

    def _update(
        self,
        trajectories: list[Trajectory],
        advantages: torch.Tensor,
        used: torch.Tensor,
        used_everywhere: int,
    ) -> dict[str, float]:
        """One optimizer step over this process's trajectories, in micro-batches of similar
        lengths (less padding; the step's loss does not depend on the grouping)."""
        args, device = self.args, self.accelerator.device
        size = args.micro_batch_size
        rows = training_samples(trajectories, advantages, used, args.step_rewards == "tokens")
        rows.sort(key=lambda row: row.length)  # stable: ties keep their order
        batches = [
            collate(rows[i : i + size], self.pad_id).to(device) for i in range(0, len(rows), size)
        ]
        tokens = sum(float(b.loss_mask[:, 1:].sum()) for b in batches)
        tokens = (
            float(sum(self._gather([tokens]))) if self.accelerator.num_processes > 1 else tokens
        )
        normalizer = StepNormalizer(
            sequences=used_everywhere,
            tokens=tokens,
            micro_batches=len(batches) * self.accelerator.num_processes,
            max_tokens=args.limits.max_episode_tokens,
        )
        old = self._old_logprobs(batches) if args.num_iterations > 1 else [None] * len(batches)
        self.model.train()
        totals: Counter[str] = Counter()
        for iteration in range(args.num_iterations):
            passed: Counter[str] = Counter()  # figures summed over micro-batches
            for batch, old_logprobs in zip(batches, old, strict=True):
                passed.update(self._micro_step(batch, normalizer, old_logprobs))
            if args.max_grad_norm:
                grad_norm = self.accelerator.clip_grad_norm_(
                    self.model.parameters(), args.max_grad_norm
                )
                passed["grad_norm"] = float(grad_norm) * len(batches)  # type: ignore[assignment]
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if args.num_iterations > 1:
                passed[f"clip_fraction/pass{iteration + 1}"] = passed["clip_fraction"]
            totals.update(passed)
        self.scheduler.step()
        self.model.eval()
        return {k: v / len(batches) / args.num_iterations for k, v in totals.items()} | {
            k: v / len(batches) for k, v in totals.items() if k.startswith("clip_fraction/")
        }

    def _old_logprobs(self, batches: list[Any]) -> list[torch.Tensor]:
        """The policy's logprobs before this step's first pass: the ratio's denominator."""
        self.model.eval()
        with torch.no_grad():
            return [self._logprobs(self.model, batch) for batch in batches]

    def _logprobs(self, model: Any, batch: Any) -> torch.Tensor:
        args = self.args
        with torch.autocast(batch.input_ids.device.type, torch.bfloat16, enabled=args.bf16):
            return token_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                args.logprob_chunk_size,
                args.temperature,
                compiled=compile_by_default(args.compile_logprobs, batch.input_ids.device),
            )

    def _micro_step(
        self, batch: Any, normalizer: StepNormalizer, old_logprobs: torch.Tensor | None
    ) -> dict[str, float]:
        """Forward and backward of one micro-batch; `old_logprobs` None: this pass's own
        (detached), i.e. a single pass."""
        args = self.args
        mask, sampling_logprobs, _ = batch.targets()
        logprobs = self._logprobs(self.model, batch)
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = self._logprobs(self.ref_model, batch)
        loss, stats = policy_loss(
            logprobs,
            logprobs.detach() if old_logprobs is None else old_logprobs,
            batch.token_advantages[:, 1:],
            mask,
            normalizer,
            loss_type=args.loss_type,
            clip_low=args.epsilon,
            clip_high=args.clip_high,
            beta=args.beta,
            ref_logprobs=ref,
            sampling_logprobs=sampling_logprobs,
            importance_cap=args.importance_sampling_cap if args.importance_sampling else None,
            episode_tokens=batch.episode_tokens,
        )
        self.accelerator.backward(loss)
        stats["loss"] = loss.item()
        return stats

    def _step_metrics(
        self,
        everyone: list[tuple[float, bool]],
        trajectories: list[Trajectory],
        sources: dict[str, list[float]],
        used: torch.Tensor,
    ) -> dict[str, Any]:
        rewards = [r for r, _ in everyone]
        summary = summarize(
            self._gather([outcome(t) for t in trajectories]), self.args.success_threshold
        )
        metrics: dict[str, Any] = {
            "reward": summary["reward"],
            "reward_std": statistics.pstdev(rewards),
            "success_rate": summary["success_rate"],
            "excluded": sum(not v for _, v in everyone),
            "groups_without_signal": _groups_without_signal(
                rewards, used, self.args.num_generations
            ),
            **{k: summary[k] for k in ("turns", "tool_calls", "tool_failures", "statuses")},
        }
        for name, values in sources.items():
            finite = [v for v in values if not math.isnan(v)]
            if finite and len(sources) > 1:
                metrics[f"rewards/{name}"] = statistics.fmean(finite)
        metrics.update({f"env/{name}": value for name, value in summary["env"].items()})
        return metrics

    # -- evaluation, warm-up, saving ----------------------------------------------------------
    def evaluate(
        self,
        rows: Sequence[Row] | None = None,
        temperature: float = 0.0,
        samples_file: str | None = None,
    ) -> dict:
        """Play each row once (greedy by default); returns mean reward, success rate, turns,
        tool calls, valid tool calls and status counts. With `samples_file`, the episodes are
        also written to that file in `output_dir` (JSONL trajectories, replacing it)."""
        rows = [dict(r) for r in (rows if rows is not None else self.eval_rows)]
        if not rows:
            raise ValueError("no evaluation rows (pass eval_dataset or rows)")
        # the settings go to this run only: training rollouts in flight keep theirs
        trajectories = self.sampler.evaluate(rows, temperature)
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
            demos = self._demonstrations(rows)
        losses, key, self.warmup_cached_from = None, "", None
        if cache_dir is not None and self.accelerator.num_processes > 1:
            cache_dir = None  # each process would decide alone whether it hits
        if cache_dir is not None:
            with self.stages.stage("warm-up cache"):
                key = warmup_key(self._unwrapped, demos, config)
                losses = load_warmup(Path(cache_dir), key, self._unwrapped)
            if losses is not None:
                self.warmup_cached_from = Path(cache_dir) / "warmup" / key
        if losses is None:
            with self.stages.stage("warm-up"):
                losses = self._warmup_sft(demos, config)
            if cache_dir is not None:
                with self.stages.stage("warm-up cache"):
                    store_warmup(Path(cache_dir), key, self._unwrapped, losses)
        self._unwrapped.eval()
        if self.ref_model is not None:  # the KL anchors to the policy RL starts from
            self.ref_model = _frozen_copy(self._unwrapped)
        with self.stages.stage("weight sync"):
            self._sync_engine()
        return losses

    def _warmup_sft(self, demos: list[Trajectory], config: SFTConfig) -> list[float]:
        steps = config.epochs * -(-len(demos) // config.batch_size)
        bar = self._progress("warm-up", steps)

        def advance(step: int, loss: float) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")

        try:
            return warmup_sft(self._unwrapped, demos, self.pad_id, config, on_step=advance)
        finally:
            if bar is not None:
                bar.close()

    def _progress(self, desc: str, total: int | None, start: int = 0) -> Any:
        """A tqdm bar of steps on the main process when `progress_bar` is on, else None."""
        if not (self.args.progress_bar and self.accelerator.is_main_process):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=start, desc=desc, unit="step")

    def _demonstrations(self, rows: Sequence[Row]) -> list[Trajectory]:
        return demonstrations(
            self.make_env,
            [dict(r) for r in rows],
            self.tokenizer,
            seeds=list(range(len(rows))),
            parser=self.args.parser,
            chat_template=self.agent.renderer.chat_template,  # a training template, if chosen
            chat_template_kwargs=self.args.chat_template_kwargs,
            per_turn=self.agent.renderer.per_turn,
        )

    def save(self, folder: str | Path) -> Path | None:
        """A checkpoint: the main process writes the model, optimizer and schedule; every
        process writes its own random states (each samples with its own seed)."""
        with self.stages.stage("checkpoint"):
            return self._save(folder)

    def _save(self, folder: str | Path) -> Path | None:
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:
            save_random_states(folder, self.accelerator.process_index)
            self.accelerator.wait_for_everyone()
            return None
        saved = save_checkpoint(
            folder, self._unwrapped, self.tokenizer, self.optimizer, self.scheduler, self.step
        )
        self.accelerator.wait_for_everyone()
        return saved

    @property
    def _unwrapped(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    def _path(self, name: str) -> Path:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return self.output_dir / name

    def _log(self, metrics: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            self.log.log(self.step, metrics)

    def _make_agent(self) -> Agent:
        """The agent playing the rollouts: the engine, the template choices and the limits."""
        args = self.args
        return Agent(
            self.engine,
            self.tokenizer,
            parser=args.parser,
            chat_template=args.chat_template,
            chat_template_kwargs=args.chat_template_kwargs,
            per_turn=args.per_turn,
            limits=args.limits,
            sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p),
            batch_wait=args.batch_wait,
        )

    def _sync_engine(self) -> None:
        """Give the engine the policy's current weights (transformers samples from the model
        itself; vLLM gets them with any LoRA adapters merged)."""
        if capabilities(self.engine).update_with == "model":
            self.engine.update_weights(self._unwrapped)
        else:
            self.engine.update_weights(policy_state_dict(self._unwrapped))
        self._engine_version = self.step

    def _make_engine(self) -> Any:
        args = self.args
        if args.engine == "hf":
            return HFEngine(self._unwrapped, self.tokenizer)
        folder = self._path("engine-weights")
        save_policy(self._unwrapped, folder)  # LoRA adapters merged: vLLM loads the base model
        self.tokenizer.save_pretrained(folder)
        if args.engine == "vllm":
            from toolgym.agents.engines.vllm import VLLMEngine

            # The policy's own dtype: vLLM's "auto" would serve a float32 model in 16 bits,
            # so sampling logprobs would drift from the trainer's.
            dtype = str(self._unwrapped.dtype).removeprefix("torch.")
            in_flight = max(args.prompts_per_step * args.num_generations, len(self.eval_rows))
            tokens = args.kv_cache_tokens or in_flight * (args.limits.max_episode_tokens + 256)
            kv = {} if torch.cuda.is_available() else {"kv_cache_tokens": tokens}
            quiet = {} if args.verbose else {"use_tqdm_on_load": False}
            return VLLMEngine(str(folder), dtype=dtype, seed=args.seed, **kv, **quiet)
        if args.engine == "vllm-server":
            from toolgym.agents.engines.server import VLLMServerEngine

            return VLLMServerEngine(args.vllm_server_url, weights_dir=str(folder))
        raise ValueError(f"unknown engine {args.engine!r}")


def _groups_without_signal(rewards: list[float], used: torch.Tensor, size: int) -> int:
    """Groups whose valid members all got the same reward (no gradient from them)."""
    count = 0
    for start in range(0, len(rewards), size):
        members = zip(rewards[start : start + size], used[start : start + size], strict=True)
        values = {r for r, u in members if u}
        count += len(values) <= 1
    return count


def _env_factory(
    env: str | type | Callable[[], Any], kwargs: dict[str, Any], sandbox: str | None
) -> Callable:
    if isinstance(env, str):
        toolgym.spec(env)  # fail early on an unknown id
        return lambda: toolgym.make(env, sandbox=sandbox, **kwargs)
    if isinstance(env, type):
        if sandbox in (None, "local"):
            return lambda: env(**kwargs)
        from toolgym.sandbox import sandboxed

        return lambda: sandboxed(env, kwargs, sandbox)
    if callable(env):
        if kwargs or sandbox not in (None, "local"):
            raise ValueError("env_kwargs and sandbox only apply when env is an id or a class")
        return env
    raise TypeError(f"env must be an id, a class or a factory, not {type(env).__name__}")


def _ray_pool(
    env: str | type | Callable[[], Any],
    kwargs: dict[str, Any],
    args: GRPOConfig,
    share: int,
    most: int,
) -> Any:
    """A warm pool of `env` in Ray actors spread over the cluster's nodes (`RAY_ADDRESS`, else
    a Ray of this process): `share` instances (a step's) kept warm, up to `most` alive."""
    from toolgym.registry import _resolve
    from toolgym.sandbox.pool import SandboxPool
    from toolgym.sandbox.ray_backend import RayBackend

    target, options = env, dict(kwargs)
    if isinstance(env, str):
        spec = toolgym.spec(env)  # fail early on an unknown id
        target = _resolve(spec.entry_point, what=f"entry point of {env}")
        options = {**spec.kwargs, **kwargs}
    if not isinstance(target, type):
        raise ValueError(
            'sandbox="ray" needs an environment class or an id registered with one (a Ray '
            f"actor imports it by module and name), not {target!r}"
        )
    backend = RayBackend(resources=dict(args.sandbox_resources or {}), spread=True)
    return SandboxPool(
        target,
        options,
        backend=backend,
        size=share,
        max_instances=most,
        start_threads=min(32, max(1, most)),
    )


def _frozen_copy(model: Any) -> Any:
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


def _with_lora(model: Any, lora: dict[str, Any]) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise ImportError("LoRA needs peft: pip install 'toolgym[lora]'") from error
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))


def _route_engine_logs(args: GRPOConfig) -> Path | None:
    """The engine's log lines to `output_dir/engine.log` (its path), or, with `verbose`, to
    the terminal (None), undoing what an earlier trainer in this process set."""
    if args.verbose:
        engine_logs_to_terminal()
        return None
    return engine_logs_to_file(args.engine_log_path)
