"""The learner: the part of training that owns the policy's weights.

It holds the model (prepared by accelerate), the optimizer and its schedule, the frozen
reference model of the KL term, and checkpoints. It takes played episodes with their
advantages and makes one optimizer step; it knows nothing of engines, agents or
environments (`toolgym.algorithms.sampler` plays the episodes, `GRPOTrainer` joins the two).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import get_scheduler

from toolgym.agents.images import VisionInputs, images_bound
from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.batch import collate, idle_batch, training_samples
from toolgym.algorithms.checkpoint import load_checkpoint, save_checkpoint, save_random_states
from toolgym.algorithms.compiled_layers import compiled_layers
from toolgym.algorithms.config import GRPOConfig, SFTConfig
from toolgym.algorithms.fused_loss import learner_loss, resolve_loss_impl
from toolgym.algorithms.losses import (
    StepNormalizer,
    compile_by_default,
    token_logprobs,
)
from toolgym.algorithms.optim import adamw
from toolgym.algorithms.placement import frozen_copy, placement_for
from toolgym.algorithms.prefix_sharing import share_prefix_by_default
from toolgym.algorithms.sft import warmup_sft
from toolgym.algorithms.warmup_cache import cached_warmup
from toolgym.runtime.heap import return_freed_memory
from toolgym.runtime.launcher_watch import watch_launcher
from toolgym.runtime.stages import StageClock


class Learner:
    """The policy and its optimizer: one update per batch of scored episodes.

    Args:
        model: A transformers causal LM (LoRA adapters and gradient checkpointing are added
            here when `args` asks for them).
        args: The run's configuration (optimizer, loss and batching fields).
        accelerator: The processes' group; the model and optimizer are prepared with it.
        pad_id: The token that pads micro-batches.
        vision: The pixel inputs of samples that show images (`toolgym.agents.images`).
    """

    def __init__(
        self,
        model: Any,
        args: GRPOConfig,
        accelerator: Accelerator,
        pad_id: int,
        vision: VisionInputs | None = None,
    ):
        self.args, self.accelerator, self.pad_id, self.vision = args, accelerator, pad_id, vision
        refuse_images_across_processes(vision, accelerator.num_processes)
        if accelerator.num_processes > 1:  # a rank whose launcher is gone ends itself
            watch_launcher(accelerator.process_index)
        self.placement = placement_for(accelerator, args)
        """Where the weights live over the processes (replicated, or sharded by FSDP2)."""
        model = self.placement.before_adapters(model)
        if args.lora is not None:
            model = _with_lora(model, args.lora)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = frozen_copy(model) if args.beta > 0 else None
        """The policy the KL term anchors to (None without one: `beta` 0)."""
        self.model, self.optimizer, self.scheduler = self.placement.place(
            model,
            lambda placed: adamw(
                [p for p in placed.parameters() if p.requires_grad],
                lr=args.learning_rate,
                betas=args.adam_betas,
                weight_decay=args.weight_decay,
            ),
            lambda optimizer: get_scheduler(
                args.lr_scheduler, optimizer, args.warmup_steps, args.max_steps
            ),
        )

    @property
    def sharded(self) -> bool:
        """Whether the policy is sharded over the processes (FSDP2, `sharding`)."""
        return self.placement.sharded

    @property
    def policy(self) -> Any:
        """The model without accelerate's wrapping (what is saved; sharded under FSDP)."""
        return self.placement.policy(self.model)

    @property
    def engine_policy(self) -> Any:
        """The model an in-process engine samples from: the policy, or its full replica
        under sharding (None there for servers)."""
        return self.placement.engine_policy(self.model)

    def engine_weights(self) -> tuple[Any, dict[str, torch.Tensor] | None]:
        """What a weight sync hands the engine: (the model it samples from, the full weights
        or None to take them from that model). Under sharding a collective: the full weights
        are gathered in every process and the replica is refreshed with them."""
        return self.placement.engine_weights(self.model)

    def anchor_reference(self) -> None:
        """Make the KL term's reference the current policy (after a warm-up; a collective
        under sharding)."""
        if self.ref_model is not None:
            self.ref_model = self.placement.reference(self.model, self.ref_model)

    def warm_up(
        self,
        demos: list[Trajectory],
        config: SFTConfig,
        cache_dir: Path | None,
        stages: StageClock,
        on_step: Callable[[int, float], None] | None = None,
    ) -> tuple[list[float], Path | None]:
        """Supervised fine-tuning on `demos` (`toolgym.algorithms.sft`), or its result loaded
        from `cache_dir` (`toolgym.algorithms.warmup_cache`); then the KL term's reference
        is the warmed policy. Returns the step losses and the cache entry loaded (or None)."""
        result = cached_warmup(
            lambda: warmup_sft(self.policy, demos, self.pad_id, config, on_step=on_step),
            self.policy,
            demos,
            config,
            cache_dir,
            stages,
        )
        self.policy.eval()
        self.anchor_reference()
        return_freed_memory()
        return result

    # -- the update -------------------------------------------------------------------------
    def update(
        self,
        trajectories: list[Trajectory],
        advantages: torch.Tensor,
        used: torch.Tensor,
        used_everywhere: int,
        turn_credit: list[list[list[float]]] | None = None,
    ) -> dict[str, float]:
        """One optimizer step over this process's trajectories, in micro-batches of similar
        lengths (less padding; the step's loss does not depend on the grouping); returns the
        loss's figures averaged over micro-batches and passes. `turn_credit`: per trajectory,
        per sample, per completion token, the advantage (`GRPOConfig.credit="turn"`)."""
        args = self.args
        size = args.micro_batch_size
        rows = training_samples(
            trajectories, advantages, used, args.step_rewards == "tokens", turn_credit
        )
        rows.sort(key=lambda row: row.length)  # stable: ties keep their order
        batches = [
            collate(rows[i : i + size], self.pad_id).to(self.accelerator.device)
            for i in range(0, len(rows), size)
        ]
        tokens = sum(float(b.loss_mask[:, 1:].sum()) for b in batches)
        everyone = self.gather([(tokens, len(batches))])
        normalizer = StepNormalizer(
            sequences=used_everywhere,
            tokens=float(sum(t for t, _ in everyone)),
            micro_batches=sum(n for _, n in everyone),
            max_tokens=args.limits.max_episode_tokens,
        )
        count = len(batches)
        # Every process runs as many forward and backward passes as the busiest one (DDP's
        # and FSDP's collectives pair up pass by pass); the extra ones train on nothing.
        batches += [idle_batch(batches, self.pad_id, self.accelerator.device)] * (
            max(n for _, n in everyone) - count
        )
        device = self.accelerator.device
        with compiled_layers(self.policy, compile_by_default(args.compile_model, device)):
            totals = self._passes(batches, count, normalizer)
        self.scheduler.step()
        self.model.eval()
        count = max(count, 1)
        del batches
        return_freed_memory()  # the step's activations, gradients and logits
        return {k: v / count / args.num_iterations for k, v in totals.items()} | {
            k: v / count for k, v in totals.items() if k.startswith("clip_fraction/")
        }

    def _passes(self, batches: list[Any], real: int, normalizer: StepNormalizer) -> Counter[str]:
        """`num_iterations` passes over the micro-batches (the first `real` of them hold
        samples, the rest are idle), an optimizer step after each; returns the loss's
        figures summed over the real micro-batches and passes."""
        args = self.args
        old = self._old_logprobs(batches) if args.num_iterations > 1 else [None] * len(batches)
        self.model.train()
        totals: Counter[str] = Counter()
        for iteration in range(args.num_iterations):
            passed: Counter[str] = Counter()  # figures summed over micro-batches
            for index, (batch, old_logprobs) in enumerate(zip(batches, old, strict=True)):
                stats = self._micro_step(batch, normalizer, old_logprobs)
                if index < real:
                    passed.update(stats)
            if args.max_grad_norm:
                passed["grad_norm"] = self._clip_gradients() * max(real, 1)  # type: ignore[assignment]
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if args.num_iterations > 1:
                passed[f"clip_fraction/pass{iteration + 1}"] = passed["clip_fraction"]
            totals.update(passed)
        return totals

    def _clip_gradients(self) -> float:
        """Clip the gradients' total norm to `max_grad_norm`; returns the norm before."""
        return self.placement.clip_gradients(self.model, self.args.max_grad_norm)

    @property
    def learning_rate(self) -> float:
        """The schedule's current learning rate."""
        return float(self.scheduler.get_last_lr()[0])

    def _old_logprobs(self, batches: list[Any]) -> list[torch.Tensor]:
        """The policy's logprobs before this step's first pass: the ratio's denominator."""
        self.model.eval()
        with torch.no_grad():
            return [self._logprobs(self.model, batch) for batch in batches]

    def _logprobs(self, model: Any, batch: Any) -> torch.Tensor:
        args = self.args
        autocast = torch.autocast(batch.input_ids.device.type, torch.bfloat16, enabled=args.bf16)
        with autocast, images_bound(model, self.vision, batch.input_ids, batch.images):
            return token_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                args.logprob_chunk_size,
                args.temperature,
                compiled=compile_by_default(args.compile_logprobs, batch.input_ids.device),
                share_prefix=self._share_prefix(batch),
            )

    def _share_prefix(self, batch: Any) -> bool:
        """Whether `batch`'s common prompt is computed once (never with images: the rows'
        pixel inputs go with their whole sequences)."""
        device = batch.input_ids.device
        return share_prefix_by_default(self.args.share_prefix, device) and not batch.images

    def _micro_step(
        self, batch: Any, normalizer: StepNormalizer, old_logprobs: torch.Tensor | None
    ) -> dict[str, float]:
        """Forward and backward of one micro-batch; `old_logprobs` None: this pass's own
        (detached), i.e. a single pass."""
        args = self.args
        mask, sampling_logprobs, _ = batch.targets()
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = self._logprobs(self.ref_model, batch)
        settings = args.loss_keywords() | dict(
            advantages=batch.token_advantages[:, 1:],
            mask=mask,
            normalizer=normalizer,
            ref_logprobs=ref,
            sampling_logprobs=sampling_logprobs,
            episode_tokens=batch.episode_tokens,
        )
        autocast = torch.autocast(batch.input_ids.device.type, torch.bfloat16, enabled=args.bf16)
        with autocast, images_bound(self.model, self.vision, batch.input_ids, batch.images):
            loss, stats = learner_loss(
                resolve_loss_impl(args.loss_impl, args.loss_settings().whole_sequences),
                self.model,
                batch,
                old_logprobs,
                settings,
                args.logprob_chunk_size,
                args.temperature,
                compile_by_default(args.compile_logprobs, batch.input_ids.device),
                self._share_prefix(batch),
            )
        # DDP and FSDP average the processes' gradients, and `normalizer` already divides
        # by counts over every process: scaled back, the step is the same however split.
        self.accelerator.backward(loss * self.accelerator.num_processes)
        stats["loss"] = loss.item()
        return stats

    def gather(self, items: list[Any]) -> list[Any]:
        """Every process's `items`, in process order (this process's alone)."""
        return gather_object(items) if self.accelerator.num_processes > 1 else items

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, folder: str | Path, tokenizer: Any, step: int) -> Path | None:
        """A checkpoint: the main process writes the model, optimizer and schedule; every
        process writes its own random states (each samples with its own seed)."""
        self.accelerator.wait_for_everyone()
        weights, optimizer_state = self.placement.checkpoint_state(self.model, self.optimizer)
        if not self.accelerator.is_main_process:
            save_random_states(folder, self.accelerator.process_index)
            self.accelerator.wait_for_everyone()
            return None
        saved = save_checkpoint(
            folder,
            self.policy,
            tokenizer,
            self.optimizer,
            self.scheduler,
            step,
            weights=weights,
            optimizer_state=optimizer_state,
        )
        self.accelerator.wait_for_everyone()
        return saved

    def load(self, folder: str | Path) -> int:
        """Restore a checkpoint of `save`; returns its step."""
        return load_checkpoint(
            folder,
            self.policy,
            self.optimizer,
            self.scheduler,
            rank=self.accelerator.process_index,
        )


def refuse_images_across_processes(vision: VisionInputs | None, processes: int) -> None:
    """Images train in one process only for now: a process whose micro-batch shows none would
    skip the vision tower's pass that DDP's and FSDP's gradient reductions wait for."""
    if vision is not None and processes > 1:
        raise ValueError(
            "images in tool results are trained in one process only for now; launch one "
            "process, or give the trainer a tokenizer instead of a processor"
        )


def load_policy(name: str, tokenizer: Any = None) -> tuple[Any, Any]:
    """A model named for `toolgym.agents.models.load_model` and its tokenizer (`tokenizer`
    when given)."""
    from toolgym.agents.models import load_model, load_tokenizer

    return load_model(name), tokenizer or load_tokenizer(name)


def _with_lora(model: Any, lora: dict[str, Any]) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise ImportError("LoRA needs peft: pip install 'toolgym[lora]'") from error
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
