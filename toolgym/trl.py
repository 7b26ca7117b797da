"""TRL's names for toolgym's trainer: a TRL GRPO script ports by changing its import.

    from trl import GRPOConfig, GRPOTrainer          # before
    from toolgym.trl import GRPOConfig, GRPOTrainer  # after

`GRPOConfig` takes the fields of TRL 1.16's `GRPOConfig` that have a toolgym equivalent, with
TRL's defaults (`learning_rate=1e-6`, `logging_steps=10`, `gradient_checkpointing=True`, ...),
and maps them onto `toolgym.algorithms.GRPOConfig` (`to_toolgym`; docs/trl.md has the table).
A TRL field without an equivalent is accepted at TRL's default value (it changes nothing) and
is an error naming it at any other value; a name TRL's config does not have is an error too.

`GRPOTrainer(model, reward_funcs, args, train_dataset, ..., processing_class, peft_config,
tools, environment_factory)` takes TRL's arguments. Reward functions are called as TRL calls
them (`toolgym.algorithms.rewards`), a class's `get_reward` is a reward source as in TRL, and
a multi-environment dataset's `environment` column picks each row's environment.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolgym.agents.limits import AgentLimits
from toolgym.algorithms.config import GRPOConfig as ToolgymConfig
from toolgym.algorithms.grpo import GRPOTrainer as ToolgymTrainer

TRL_VERSION = "1.16"
"""The TRL release whose names and defaults this module follows (tested against it)."""


WITHOUT_EQUIVALENT: dict[str, Any] = {
    # field: TRL's default, accepted (it changes nothing here); any other value is an error
    "top_k": 0,
    "min_p": None,
    "repetition_penalty": 1.0,
    "generation_kwargs": None,
    "model_init_kwargs": None,
    "fp16": False,
    "remove_unused_columns": False,
    "shuffle_dataset": True,
    "disable_dropout": False,
    "sync_ref_model": False,
    "top_entropy_quantile": 1.0,
    "delta": None,
    "num_generations_eval": None,
    "vllm_enable_sleep_mode": False,
    "vllm_tensor_parallel_size": 1,
    "multi_objective_aggregation": "sum_then_normalize",
    "use_transformers_continuous_batching": False,
    "cast_lm_head_to_fp32": False,
    "entropy_coef": 0.0,
    "log_completions": False,
    "push_to_hub": False,
    "use_liger_kernel": False,
    "torch_compile": False,
    "auto_find_batch_size": False,
    "optim": "adamw_torch_fused",  # toolgym's optimizer is AdamW (fused where torch fuses it)
    "vllm_gpu_memory_utilization": 0.3,
    "gradient_checkpointing_kwargs": None,
    "load_best_model_at_end": False,
}
"""TRL fields toolgym has no equivalent for, with the TRL default it accepts."""

_ACCEPTED_ANY = (
    "use_cpu",
    "run_name",
    "logging_dir",
    "log_level",
    "logging_first_step",
    "logging_strategy",
    "dataloader_num_workers",
    "dataloader_pin_memory",
    "disable_tqdm",
    "log_completions",
    "num_completions_to_print",
    "save_total_limit",
    "save_only_model",
    "per_device_eval_batch_size",
    "do_train",
    "do_eval",
)
"""TRL fields whose value never changes what toolgym computes (toolgym picks the device, names
and logs a run by its `output_dir`, always writes every episode to `samples.jsonl`, keeps its
checkpoints, evaluates each row once): accepted as given."""


@dataclass(init=False)
class GRPOConfig:
    """TRL 1.16's `GRPOConfig` fields that map onto toolgym's, with TRL's defaults
    (TrainingArguments' where TRL keeps them; see the module docstring); `to_toolgym()` makes
    the `toolgym.algorithms.GRPOConfig` they mean."""

    output_dir: str | None = None
    seed: int = 42
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0
    lr_scheduler_type: str = "linear"
    warmup_steps: float = 0
    max_steps: int = -1
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    num_generations: int = 8
    max_completion_length: int = 512
    max_tool_calling_iterations: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    beta: float = 0.0
    num_iterations: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    loss_type: str = "dapo"
    scale_rewards: Any = "group"
    reward_weights: list[float] | None = None
    mask_truncated_completions: bool = False
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_server_base_url: str | None = None
    vllm_server_host: str = "0.0.0.0"
    vllm_server_port: int = 8000
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_max: float | None = 3.0
    vllm_importance_sampling_clip_min: float | None = None
    importance_sampling_level: str = "token"
    off_policy_mask_threshold: float | None = None
    use_bias_correction_kl: bool = True
    gradient_checkpointing: bool = True
    bf16: bool | None = None
    logging_steps: int = 10
    save_steps: int = 500
    save_strategy: str = "steps"
    eval_strategy: str = "no"
    eval_steps: int | None = None
    report_to: Any = "none"
    chat_template_kwargs: dict[str, Any] | None = None

    def __init__(self, **fields: Any) -> None:
        values = dict(MAPPED)
        for name, value in fields.items():
            if name in MAPPED:
                values[name] = value
            elif name in WITHOUT_EQUIVALENT:
                if value != WITHOUT_EQUIVALENT[name]:
                    raise TypeError(
                        f"toolgym.trl.GRPOConfig: TRL's {name}={value!r} has no toolgym "
                        f"equivalent; leave it at TRL's default ({WITHOUT_EQUIVALENT[name]!r}) "
                        "or see docs/trl.md"
                    )
            elif name not in _ACCEPTED_ANY:
                raise TypeError(
                    f"toolgym.trl.GRPOConfig: {name!r} is neither a TRL {TRL_VERSION} field "
                    "toolgym maps nor one it accepts (TRL has fields toolgym has no "
                    f"equivalent for); the mapped fields: {', '.join(MAPPED)} (docs/trl.md)"
                )
        for name, value in values.items():
            setattr(self, name, value)
        self.scale_rewards = {True: "group", False: "none"}.get(
            self.scale_rewards, self.scale_rewards
        )

    def __repr__(self) -> str:
        changed = {k: v for k, v in vars(self).items() if MAPPED.get(k) != v}
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def prompts_per_step(self, num_processes: int = 1) -> int:
        """Rows per optimizer step: TRL's generation batch over `num_generations`."""
        accumulation = self.gradient_accumulation_steps
        if self.steps_per_generation not in (None, accumulation):
            raise TypeError(
                "toolgym.trl: steps_per_generation must equal gradient_accumulation_steps "
                "(toolgym makes one optimizer step per generation batch; num_iterations "
                "repeats the passes over it)"
            )
        per_step = self.per_device_train_batch_size * num_processes * accumulation
        batch = self.generation_batch_size or per_step
        if batch != per_step:
            raise TypeError(
                f"toolgym.trl: generation_batch_size={batch} makes TRL take {batch // per_step} "
                "optimizer steps per generation; toolgym takes one (leave generation_batch_size "
                "unset, or set per_device_train_batch_size x gradient_accumulation_steps to it)"
            )
        if batch % self.num_generations:
            raise ValueError(
                f"the generation batch ({batch}) must be divisible by num_generations "
                f"({self.num_generations}), as in TRL"
            )
        return batch // self.num_generations

    def to_toolgym(self, dataset_size: int, num_processes: int | None = None) -> ToolgymConfig:
        """The toolgym configuration these fields mean (docs/trl.md). `num_processes`: those
        of the launch (`WORLD_SIZE`, 1 without one), whose batches together make TRL's
        generation batch. TRL counts optimizer steps, `num_iterations` of them per generation
        batch; toolgym counts generation batches: `max_steps` is divided accordingly."""
        if num_processes is None:
            num_processes = int(os.environ.get("WORLD_SIZE", "1"))
        prompts = self.prompts_per_step(num_processes)
        steps = self.max_steps
        if steps is None or steps <= 0:
            steps = max(1, math.ceil(self.num_train_epochs * dataset_size / prompts))
        else:
            steps = max(1, math.ceil(steps / self.num_iterations))
        return ToolgymConfig(
            output_dir=self.output_dir or "trainer_output",  # as TrainingArguments
            seed=self.seed,
            max_steps=int(steps),
            prompts_per_step=prompts,
            num_generations=self.num_generations,
            micro_batch_size=self.per_device_train_batch_size,
            temperature=self.temperature,
            top_p=self.top_p,
            limits=self.limits(),
            **self._optimisation(steps),
            **self._objective(),
            **self._logging(),
            **self._engine(),
        )

    def _optimisation(self, steps: int) -> dict[str, Any]:
        warmup = self.warmup_steps or 0
        if 0 < warmup < 1:  # transformers 5 reads a fraction as a ratio of the steps
            warmup = math.ceil(warmup * steps)
        return {
            "learning_rate": self.learning_rate,
            "weight_decay": self.weight_decay,
            "adam_betas": (self.adam_beta1, self.adam_beta2),
            "max_grad_norm": self.max_grad_norm,
            "lr_scheduler": _scheduler(self.lr_scheduler_type),
            "warmup_steps": int(warmup),
            "gradient_checkpointing": self.gradient_checkpointing,
            "bf16": True if self.bf16 is None else bool(self.bf16),  # TRL: not fp16
        }

    def _objective(self) -> dict[str, Any]:
        return {
            "beta": self.beta,
            "num_iterations": self.num_iterations,
            "epsilon": self.epsilon,
            "epsilon_high": self.epsilon_high,
            "loss_type": self.loss_type,
            "scale_rewards": self.scale_rewards,
            "reward_weights": self.reward_weights,
            "mask_truncated": self.mask_truncated_completions,
            # TRL corrects only what vLLM sampled
            "importance_sampling": self.vllm_importance_sampling_correction and self.use_vllm,
            "importance_sampling_mode": self.vllm_importance_sampling_mode,
            "importance_sampling_cap": self.vllm_importance_sampling_clip_max,
            "importance_sampling_min": self.vllm_importance_sampling_clip_min,
            "importance_sampling_level": self.importance_sampling_level,
            "off_policy_mask_threshold": self.off_policy_mask_threshold,
            "kl_bias_correction": self.use_bias_correction_kl,
            # TRL caps CISPO's ratio at epsilon_high itself (ScaleRL's epsilon_max)
            "cispo_cap": self.epsilon if self.epsilon_high is None else self.epsilon_high,
        }

    def _logging(self) -> dict[str, Any]:
        evaluating = self.eval_strategy == "steps"
        return {
            "logging_steps": self.logging_steps,
            "save_steps": self.save_steps if self.save_strategy == "steps" else 0,
            "eval_steps": (self.eval_steps or self.logging_steps) if evaluating else 0,
            "report_to": _trackers(self.report_to),
            "chat_template_kwargs": dict(self.chat_template_kwargs or {}),
        }

    def limits(self) -> AgentLimits:
        """TRL's completion budget (model and tool tokens, all turns) and tool-call rounds."""
        budget = self.max_completion_length
        rounds = self.max_tool_calling_iterations
        return AgentLimits(
            max_turns=budget if rounds is None else rounds + 1,  # no limit but the budget
            max_new_tokens=budget,
            max_episode_tokens=budget,
        )

    def _engine(self) -> dict[str, Any]:
        if not self.use_vllm:
            return {"engine": "hf"}
        if self.vllm_mode == "colocate":
            return {"engine": "vllm"}
        if self.vllm_mode == "server":
            url = self.vllm_server_base_url
            url = url or f"http://{self.vllm_server_host}:{self.vllm_server_port}"
            return {"engine": "vllm-server", "vllm_server_url": url}
        raise TypeError(f"toolgym.trl: unknown vllm_mode {self.vllm_mode!r}")


MAPPED: dict[str, Any] = {item.name: item.default for item in dataclasses.fields(GRPOConfig)}
"""TRL's fields that map onto toolgym's, with TRL's defaults."""


def _scheduler(name: str) -> str:
    names = {"linear": "linear", "cosine": "cosine", "constant": "constant"}
    names["constant_with_warmup"] = "constant"  # toolgym's constant warms up by warmup_steps
    if name not in names:
        raise TypeError(
            f"toolgym.trl: lr_scheduler_type={name!r} has no toolgym equivalent "
            f"(toolgym has {', '.join(names)})"
        )
    return names[name]


def _trackers(report_to: Any) -> list[str]:
    if report_to in (None, "none", []):
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    if "all" in names:
        raise TypeError(
            'toolgym.trl: report_to="all": name the trackers (trackio, wandb, tensorboard)'
        )
    return names


class GRPOTrainer(ToolgymTrainer):
    """toolgym's `GRPOTrainer` with TRL's arguments (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        reward_funcs: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: Any = None,
        optimizers: tuple[Any, Any] = (None, None),
        peft_config: Any = None,
        tools: Sequence[Callable[..., Any]] | None = None,
        environment_factory: Callable[[], Any] | Mapping[str, Callable[[], Any]] | None = None,
        rollout_func: Any = None,
    ) -> None:
        unsupported = {
            "reward_processing_classes": reward_processing_classes,
            "callbacks": callbacks,
            "rollout_func": rollout_func,
            "optimizers": None if tuple(optimizers) == (None, None) else optimizers,
        }
        for name, value in unsupported.items():
            if value is not None:
                raise TypeError(
                    f"toolgym.trl.GRPOTrainer: {name} has no toolgym equivalent (docs/trl.md; "
                    "toolgym's own rollout_fn is an async function over a RolloutContext)"
                )
        if train_dataset is None:
            raise TypeError("toolgym.trl.GRPOTrainer needs train_dataset (rows for reset)")
        config = args if args is not None else GRPOConfig()
        if not isinstance(config, GRPOConfig):
            raise TypeError("args must be a toolgym.trl.GRPOConfig (TRL's field names)")
        several = isinstance(environment_factory, Mapping)
        rows = [_row(dict(row), several) for row in train_dataset]
        toolgym_config = config.to_toolgym(len(rows))
        if peft_config is not None:
            toolgym_config.lora = _lora_arguments(peft_config)
        super().__init__(
            model,
            _environment(environment_factory, tools),
            rows,
            reward_funcs=_reward_functions(reward_funcs),
            args=toolgym_config,
            tokenizer=processing_class,
            eval_dataset=None
            if eval_dataset is None
            else [_row(dict(r), several) for r in eval_dataset],
        )


def _row(row: dict[str, Any], several: bool) -> dict[str, Any]:
    """With several environments (a dict factory), TRL's `environment` column names a row's
    environment, toolgym's `env` column; with one, the column is data, as in TRL."""
    if several and "environment" in row and "env" not in row:
        row["env"] = row.pop("environment")
    return row


def _environment(factory: Any, tools: Sequence[Callable[..., Any]] | None) -> Any:
    if factory is not None and tools:
        raise TypeError(
            "toolgym.trl.GRPOTrainer: tools beside an environment_factory are not supported; "
            "make them methods of the environment class"
        )
    if factory is not None:
        return dict(factory) if isinstance(factory, Mapping) else factory
    if tools:
        return list(tools)
    raise TypeError("toolgym.trl.GRPOTrainer needs environment_factory or tools")


def _reward_functions(funcs: Any) -> list[Callable[..., Any]]:
    funcs = (
        []
        if funcs is None
        else [funcs]
        if callable(funcs) or isinstance(funcs, str)
        else list(funcs)
    )
    for func in funcs:
        if not callable(func):
            raise TypeError(
                f"toolgym.trl.GRPOTrainer: reward function {func!r}: reward models by name are "
                "not supported; pass a function (it may call a model)"
            )
    return funcs


def _lora_arguments(peft_config: Any) -> dict[str, Any]:
    """A peft `LoraConfig`'s constructor arguments (toolgym builds its own from them)."""
    if not dataclasses.is_dataclass(peft_config):
        raise TypeError("peft_config must be a peft LoraConfig")
    defaults: Any = type(peft_config)()  # type: ignore[misc]  # a peft LoraConfig class
    return {
        item.name: getattr(peft_config, item.name)
        for item in dataclasses.fields(peft_config)
        if item.init
        and item.name != "task_type"  # toolgym sets CAUSAL_LM itself
        and getattr(peft_config, item.name) != getattr(defaults, item.name)
    }
