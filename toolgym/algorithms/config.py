"""Training configuration: every knob a documented dataclass field with a usable default."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from toolgym.agents.compaction import Compaction
from toolgym.agents.limits import AgentLimits
from toolgym.sandbox import BACKENDS

if TYPE_CHECKING:
    from toolgym.algorithms.losses import LossSettings

LossType = Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo"]
ImportanceMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
ScaleRewards = Literal["group", "batch", "none"]
EngineName = Literal["hf", "vllm", "vllm-server"]


@dataclass
class GRPOConfig:
    """Settings of `GRPOTrainer` (and, with `advantage="rloo"`, `RLOOTrainer`).

    One training step draws `prompts_per_step` rows, plays `num_generations` episodes of each
    (a group, every member reset with the same seed), scores them, and makes one optimizer
    step over all of them in micro-batches of `micro_batch_size` trajectories.
    """

    # -- output -------------------------------------------------------------------------------
    output_dir: str = "runs/grpo"
    """Where metrics, samples, checkpoints and the reward plot go."""
    seed: int = 0
    """Seeds data order, episode seeds, sampling and initialisation of anything random."""
    distributed_timeout: float = 600.0
    """Seconds a process waits in a collective (a gather, a gradient all-reduce) for its
    peers before failing with the lost rank named, instead of hanging (several processes
    only; a process whose launcher is gone exits at once, `runtime/launcher_watch.py`)."""

    # -- optimisation -------------------------------------------------------------------------
    learning_rate: float = 1e-6
    """Peak learning rate of AdamW."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Schedule after warm-up: constant, linear decay to 0, or cosine decay to 0."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from 0."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 turns it off)."""
    max_steps: int = 100
    """Training steps (optimizer steps)."""
    max_seconds: float | None = None
    """A time budget for `train()`: no step starts that would, at the mean duration of the
    steps so far, end more than this many seconds after `train()` began (the first step
    always runs; `stopped_by` says why training ended). None: run `max_steps`. With a
    schedule that decays, `max_steps` still sets its length."""
    prompts_per_step: int = 4
    """Distinct dataset rows per step in all (several processes share them out)."""
    num_generations: int = 8
    """Episodes per row (the group size); at least 2 for a group baseline."""
    micro_batch_size: int = 8
    """Trajectories per forward/backward pass; gradients accumulate over one step's
    micro-batches (this is the gradient-accumulation knob)."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk when computing logprobs, so full-vocabulary float32 logits are never
    held for the whole batch (fewer where one chunk's float32 logits would pass 256 MiB: 256
    tokens for a 262,144-entry vocabulary)."""
    compile_logprobs: bool | None = None
    """Compile the per-chunk output head and log-softmax with `torch.compile` (about 1.3x
    faster update steps on an H100; the first step pays the compilation). None: on when
    training on a CUDA device, off elsewhere (CPU compilation is slow and needs a compiler)."""
    compile_model: bool | None = None
    """Run the policy's decoder layers through `torch.compile` during the update (each
    layer's norms, rotary embedding, activation and residual adds fuse; on an H100 a 0.5B
    model's update step took 0.71 of the time and 0.73 of the peak memory; the first step pays
    the compilation). Generation with the same model runs them uncompiled. None: on when
    training on a CUDA device, off elsewhere (CPU compilation is slow and needs a compiler)."""
    loss_impl: Literal["auto", "fused", "chunked", "full"] = "auto"
    """How the update computes the loss from the model (all give the same loss and gradients):
    "fused" applies the output head, log-softmax and loss terms chunk by chunk and takes each
    chunk's gradients at once (`toolgym.algorithms.fused_loss`: least memory, no recomputed
    logits); "chunked" computes logprobs by checkpointed chunks, then the loss; "full" holds
    the whole batch's logits (the reference). "auto": "fused" (each path falls back to full
    logits for a model whose logits the chunked head does not reproduce), or "chunked" where
    a token's term needs its whole sequence (`importance_sampling_level="sequence"`, a
    "sequence_*" `importance_sampling_mode`, `off_policy_mask_threshold`), which "fused"
    refuses."""
    share_prefix: bool | None = None
    """Compute a micro-batch's common prompt prefix once, not once per row: the prefix runs
    as a batch of one and the rows attend to its keys and values, with gradients through them
    (`toolgym.algorithms.prefix_sharing`; the same loss and gradients up to rounding). Models
    with sliding windows, length-dependent rotary scaling or dropout, FSDP, and any model whose
    shared pass fails a one-time probe run the plain pass, with a warning. None: on except on
    CUDA devices, where the rows' pass with an explicit mask measured slower than the plain
    pass's fused causal attention (docs/training.md)."""
    gradient_checkpointing: bool = True
    """Recompute each layer's activations in the backward pass instead of keeping them: the
    update then holds about a layer input per token and layer, not every intermediate (the
    embedded SmolLM2-135M's update over 24 episodes of ~650 tokens in micro-batches of 8 peaked
    at 15.5 GB without it, 7.2 GB with it, and 4.1 GB with `mmap_threshold` as well; on the
    CPU no slower in float32; on GPUs it costs some speed). On by default, as in TRL."""
    memory_check: bool = True
    """Before the engine starts, estimate the run's peak CPU memory (the policy, gradients,
    optimizer state, engine and KV cache, the update's largest micro-batch;
    `toolgym.algorithms.memory_fit`) and stop with a `MemoryError` naming the largest parts
    and the settings that shrink them when it passes the memory available, instead of being
    killed by the kernel mid-run. False: start anyway."""
    mmap_threshold: int | None = None
    """Bytes from which every allocation gets its own memory mapping, returned to the system
    when freed (glibc's `M_MMAP_THRESHOLD`, fixed for the process;
    `toolgym.runtime.heap.map_large_allocations`): the update's many 4-30 MiB tensors then
    stop fragmenting the heap, which roughly halved the update's peak above (7.2 -> 4.1 GB);
    some updates measured up to a quarter slower. None: 4 MiB when training on the CPU where
    glibc is the allocator (CUDA tensors are not glibc's); 0: leave glibc's moving threshold."""
    bf16: bool = False
    """Run the update's forward and backward passes under bfloat16 autocast (weights and
    optimizer states keep their dtype). Faster where the hardware has bf16 matrix units
    (GPUs; CPUs with AVX-512 BF16 or AMX); the importance weight absorbs the small
    difference from the engine's logprobs."""

    # -- rollouts ------------------------------------------------------------------------------
    engine: EngineName = "hf"
    """Generation backend: transformers on the policy itself, vLLM in-process, or a vLLM
    server (`vllm_server_url`)."""
    vllm_server_url: str = "http://127.0.0.1:8000"
    """Base URL of the vLLM server when `engine="vllm-server"`, or several comma-separated
    (one engine over all of them: sticky episodes, failover, one policy at a time)."""
    weight_sync: Literal["folder", "toolgym-gloo", "nccl"] = "folder"
    """How `engine="vllm-server"` gives the servers each step's weights: "folder" writes
    safetensors into the run's folder for every server to reload (same machine or shared
    storage; servers with `VLLM_SERVER_DEV_MODE=1`); "toolgym-gloo" (CPUs) and "nccl" (GPUs)
    broadcast them through vLLM's own weight-transfer API, nothing on disk, to servers
    started with `--weight-transfer-config '{"backend": "<the same>"}'` (docs/cluster.md).
    The in-process engine always loads them from memory."""
    kv_cache_tokens: int | None = None
    """Tokens the in-process vLLM engine's KV cache holds on a CPU (on a GPU vLLM sizes it
    from `gpu_memory_utilization`). None: enough for the larger of a step's episodes and the
    evaluation rows to be in flight at once at the full `limits.max_episode_tokens` plus a
    256-token prompt, at most a sixteenth of the machine's memory
    (`toolgym.agents.engines.vllm.default_kv_cache_tokens`). A smaller cache queues requests
    and recomputes earlier turns."""
    parser: str = "auto"
    """Tool-call parser: a name (`toolgym.agents.parsers.PARSERS`), "auto", "tokenizer" or
    "vllm:<name>"."""
    chat_template: str | None = None
    """A chat template to use instead of the tokenizer's own."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for every rendering of the chat template, e.g. `{"enable_thinking":
    False}`."""
    per_turn: bool | None = None
    """Train each assistant turn as its own sample (True) or each episode as one token sequence
    (False); None: one sequence exactly when the template is prefix-preserving for every shape
    of tool-call turn (see `toolgym.agents.chat`)."""
    compact_at_tokens: int | None = None
    """Compact an episode's conversation before a turn whose prompt is longer than this many
    tokens: the turns between the task and the latest `compact_keep_turns` are dropped (or
    summarised, `compact_summary`) and the episode goes on in a new sample
    (`toolgym.agents.compaction`). None: never."""
    compact_keep_turns: int = 1
    """With `compact_at_tokens`: the latest assistant turns kept as they were."""
    compact_summary: bool = False
    """With `compact_at_tokens`: the model writes a summary of the dropped turns first (a
    sampled turn, trained with the episode's advantage); False: a note replaces them."""
    sandbox: str | None = None
    """Where each rollout's environment lives: "local" (this process), "process", "docker",
    "auto" (the strongest available) or "ray": a warm `SandboxPool` of Ray actors spread over
    the nodes of the cluster at `RAY_ADDRESS` (else a Ray started for this process), a step's
    episodes started ahead and replaced in the background (`trainer.close()` stops them).
    None: the environment's registered default; for a class, "local". For other warm
    instances pass `env=SandboxPool(...).lease`."""
    sandbox_resources: dict[str, float] | None = None
    """With `sandbox="ray"`: what each environment's actor asks of its node: `num_cpus`
    (default 1), `num_gpus`, `memory` (bytes) and custom resources, e.g. `{"envhost": 1}` to
    keep environments on the nodes that offer it."""
    limits: AgentLimits = field(default_factory=AgentLimits)
    """Episode limits: `max_turns`, `max_new_tokens`, `max_episode_tokens`, `tool_timeout`
    (`toolgym.agents.AgentLimits`; a dict is accepted)."""
    temperature: float = 1.0
    """Sampling temperature during training rollouts (also applied to trainer logprobs)."""
    top_p: float = 1.0
    """Nucleus sampling during training rollouts."""
    batch_wait: float = 0.01
    """Longest wait (seconds) of a generation request for other episodes to join its batch
    (`Agent.batch_wait`); a large value makes batches, and so sampling, reproducible."""

    # -- the objective -------------------------------------------------------------------------
    advantage: Literal["grpo", "rloo"] = "grpo"
    """Group baseline: mean of the group (GRPO) or mean of the others (RLOO)."""
    curriculum: bool = False
    """Train by difficulty levels (`toolgym.algorithms.curriculum`): every row needs a
    `difficulty` column (lower is easier); each step draws rows of one level, starting at the
    easiest, and the level moves up when the mean success rate of its last
    `curriculum_window` steps reaches `curriculum_promote_at`, down at or below
    `curriculum_demote_at`. Logged per step as `curriculum_level` (the difficulty value) and
    `curriculum_moves`; a checkpoint keeps the state."""
    curriculum_window: int = 3
    """Steps at a level whose success rates decide a move."""
    curriculum_promote_at: float = 0.6
    """Mean success rate that opens the next level."""
    curriculum_demote_at: float = 0.1
    """Mean success rate at or below which the previous level returns."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: groups whose rewards are all equal (no advantage) are replaced
    by groups of fresh rows, played in extra rounds of `prompts_per_step` rows, until the step
    holds `prompts_per_step` groups with signal or `dynamic_sampling_rounds` rounds are
    played (then the step's own signal-less groups fill it). Logged per step:
    `dynamic_rounds`, `dynamic_groups_played`, `dynamic_groups_kept_without_signal`. One
    process only, for now. Off by default: what it pays on the flagship is not measured yet."""
    dynamic_sampling_rounds: int = 2
    """The most extra rounds one step plays for dynamic sampling."""
    branch_at_turn: int = 0
    """Play each group as a tree (`toolgym.algorithms.tree_rollouts`): one root plays this
    many turns, then the environment is forked and every member of the group goes on from
    there, so the members differ only after the branch point (with one tree per group their
    shared turns are not trained; see `tree_size`). 0: independent episodes. One process; the
    chat and the inline protocol (an inline turn is one generation: a REPL branches after its
    K-th line)."""
    tree_size: int | None = None
    """With `branch_at_turn`: the episodes per tree, so that each group of `num_generations`
    is `num_generations / tree_size` trees of the same row, each with a root of its own (None:
    one tree per group). With several trees, a member's turns after the branch point are
    credited against its tree's mean (its siblings), and the shared turns are trained with
    the tree's mean against the group's (`advantage="rloo"`: against the other trees' mean),
    on the tokens every member holds of them: the gradient of training the prefix once for
    the members it stands for (`toolgym.algorithms.tree_credit`)."""
    keep_in_flight: bool = False
    """Keep every training episode after each turn in `output_dir/in-flight/` (its
    environment's snapshot and its context, `toolgym.algorithms.kept_episodes`), so that a
    run resumed from a checkpoint in the same `output_dir` goes on with the episodes that
    were in flight (those sampled by the checkpoint's weights or older) from their last turn
    instead of playing them again. Costs a snapshot and a file write per turn. One process,
    the chat protocol (no `rollout_fn`, no `branch_at_turn`), environments that snapshot."""
    credit: Literal["episode", "turn"] = "episode"
    """What each assistant turn's tokens are credited with: the episode's advantage
    ("episode"), or the turn's own (`toolgym.algorithms.turn_credit`: the reward that followed
    the turn, step rewards included, minus the mean of the same for the group's other members
    at that turn; unbiased for episodes of different lengths). "turn" needs step rewards to
    mean anything (a chat environment's `StepResult.reward`, or inline step rewards) and
    `step_rewards="return"`."""
    scale_rewards: ScaleRewards = "group"
    """Divide advantages by the reward std of the group, of the batch, or not at all
    (Dr. GRPO recommends "none")."""
    loss_type: LossType = "dapo"
    """Token aggregation: `grpo` (mean per sequence, then over sequences), `bnpo` (mean over
    the micro-batch's tokens), `dapo` (sum over the step's tokens divided by their count, so
    every token weighs the same however the step is split), `dr_grpo` (sum divided by
    trajectories x `limits.max_episode_tokens`); or `cispo` (MiniMax-M1: each token's term is
    `-sg(min(ratio, cispo_cap)) * A * logp`, so a token whose ratio left the clip range still
    gets a gradient, bounded; aggregated as `dapo`)."""
    cispo_cap: float = 5.0
    """CISPO's cap of the ratio (ScaleRL's epsilon_max, 5.0 there); only with
    `loss_type="cispo"`."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Whose probability ratio the clipped objective reads: each token's, or one per
    sequence (GSPO: `exp` of the mean of the row's token log-ratios; with `loss_type="grpo"`
    the loss is GSPO's). A sequence is one training row: a whole episode, or one turn where
    episodes are trained per turn (`per_turn`). Acts only where the ratio leaves 1
    (`num_iterations` > 1, `max_staleness` > 0)."""
    max_staleness: int = 0
    """Play the rollouts of the next steps while this step's update runs, at most this many
    updates ahead (off-policy by at most `max_staleness` updates; the importance-sampling
    correction uses the engine's logprobs). 0: on-policy, each step's rollouts after the
    previous update. Needs engine="vllm" or "vllm-server"; `staleness` is logged per step
    and per sample."""
    partial_rollouts: bool = True
    """With `max_staleness` > 0, generation never drains: a step's episodes start as soon as
    the staleness bound lets them, while the slowest episodes of the steps before are still
    playing (up to `max_staleness` + 1 steps in flight), and a weight update stops the
    requests generating and resumes them on the new weights (`VLLMEngine`'s
    `in_flight_updates="continue"`; a vLLM server engine still lets them finish first and
    records no versions), so an episode's tokens may come from several updates.
    Each token records the weights that sampled it (`Sample.versions`); the importance weight
    uses each token's own sampling logprob, and `token_staleness` / `mixed_policy_episodes`
    are logged. With a `curriculum`, steps whose plays overlap draw from it in the order they
    reach it, so a resumed run may give two neighbouring steps each other's rows. False: each
    step's episodes start once the previous step's have all ended, and an update waits for
    the requests generating (today's drain)."""
    num_iterations: int = 1
    """Optimizer passes over each step's rollouts (PPO's epochs; GRPO's mu). The ratio's
    denominator (old logprobs) is taken once, before the first pass, so clipping by
    `epsilon` / `epsilon_high` acts from the second pass on; with 1 pass the ratio is 1 and
    clipping never acts. The learning-rate schedule advances once per step, not per pass."""
    epsilon: float = 0.2
    """Lower clip range of the probability ratio (acts only with `num_iterations` > 1)."""
    epsilon_high: float | None = 0.28
    """Upper clip range (DAPO's clip-higher); None means `epsilon`."""
    beta: float = 0.0
    """KL coefficient against the reference model (the starting policy); the reference is
    kept only when beta > 0."""
    kl_bias_correction: bool = False
    """Multiply the KL term by the probability ratio (TRL's `use_bias_correction_kl`, on
    there by default): its gradient then estimates the reverse KL's without bias when the
    samples come from the old policy (`num_iterations` > 1, `max_staleness` > 0)."""
    importance_sampling: bool = True
    """Correct for the engine's sampling distribution differing from the trainer's (the
    weight `exp(logp_trainer_old - logp_engine)`, bounded as `importance_sampling_mode`
    says). Either way `mismatch_kl` (KL(engine || trainer), k3 estimate over sampled tokens)
    and `mismatch_abs` (mean |logp_trainer - logp_engine|) are logged each step."""
    importance_sampling_mode: ImportanceMode = "token_truncate"
    """How the weight is bounded: per token clamped to [`importance_sampling_min`,
    `importance_sampling_cap`] ("token_truncate", truncated IS) or zeroed outside it
    ("token_mask", masked IS), or one weight per sequence from the sum of its tokens'
    log-differences, clamped or zeroed ("sequence_truncate", "sequence_mask": TRL 1.16's
    default). The masked share of tokens is logged as `is_masked`."""
    importance_sampling_cap: float | None = 2.0
    """Upper bound C_max of the weight (None: none)."""
    importance_sampling_min: float | None = None
    """Lower bound C_min of the weight (None: none). With neither bound, no correction."""
    off_policy_mask_threshold: float | None = None
    """DeepSeek-V3.2's off-policy sequence mask (OPSM): a sequence with a negative advantage
    whose mean `logp_engine - logp_trainer` over its sampled tokens exceeds this leaves the
    policy-gradient term (its KL term stays); the dropped share is logged as
    `off_policy_masked`. None: off (0.5 is a usual value)."""
    mask_truncated: bool = False
    """Leave episodes that hit a length limit (`length`, `max_turns`) out of the loss."""
    reward_weights: list[float] | None = None
    """Weights of the reward sources, in order: the environment's reward (when
    `env_reward=True`) and then each reward function. None: all 1."""
    env_reward: bool = True
    """Use the environment's own reward as a reward source."""
    step_rewards: Literal["return", "tokens", "ignore"] = "return"
    """What per-step rewards (`Trajectory.step_rewards`) do: "return" adds an inline episode's,
    and a chat episode's `AgentLimits.invalid_call_reward`s (each separate from the
    environment's reward), to the episode's reward before group advantages; "tokens" adds each
    step's reward to the advantage of the model tokens of its span (an inline step's: the text
    up to its marker; a chat episode's tool call: the assistant turn that made it), the
    episode's reward alone setting the group advantage; "ignore" only keeps them in the samples.
    A chat episode's step rewards (`StepResult.reward`, the change of the environment's reward)
    are part of its reward in every mode: never added twice, never taken out; "tokens" is what
    gives them per-turn credit ("ignore" drops the invalid-call rewards)."""
    success_threshold: float = 1.0
    """An episode with at least this reward counts as a success in the logs."""

    # -- logging, saving, evaluation -----------------------------------------------------------
    logging_steps: int = 1
    """Write metrics every this many steps."""
    save_steps: int = 0
    """Save a checkpoint every this many steps (0: only at the end)."""
    save_samples: bool = True
    """Append each step's trajectories to `samples.jsonl`."""
    eval_steps: int = 0
    """Evaluate on the eval dataset every this many steps (0: never during training)."""
    report_to: list[str] = field(default_factory=list)
    """Extra trackers: any of "trackio", "wandb", "tensorboard" (metrics JSONL is always
    written)."""
    progress_bar: bool = True
    """Show a progress bar with reward, success rate and step time."""
    verbose: bool = False
    """Show the generation engine's log lines (vLLM's start-up settings, its warnings) and
    model loading bars in the terminal; otherwise they go to `output_dir/engine.log`, and the
    terminal keeps the stages, the progress bar and the results."""
    lora: dict[str, Any] | None = None
    """Train LoRA adapters through peft with these `LoraConfig` arguments (None: full
    fine-tuning)."""

    def __post_init__(self) -> None:
        if isinstance(self.limits, dict):  # a config read back from JSON
            self.limits = AgentLimits(**self.limits)
        if self.distributed_timeout <= 0:
            raise ValueError("distributed_timeout must be positive (seconds)")
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be at least 0")
        if self.num_iterations < 1:
            raise ValueError("num_iterations must be at least 1")
        if self.num_generations < 2:
            raise ValueError("num_generations must be at least 2 for a group baseline")
        if self.loss_impl not in ("auto", "fused", "chunked", "full"):
            raise ValueError(f"unknown loss_impl {self.loss_impl!r}")
        settings = self.loss_settings()  # refuses unknown loss types, modes and levels
        from toolgym.algorithms.fused_loss import resolve_loss_impl

        resolve_loss_impl(self.loss_impl, settings.whole_sequences)  # fused + whole rows
        if self.cispo_cap <= 0:
            raise ValueError("cispo_cap must be positive")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"unknown scale_rewards {self.scale_rewards!r}")
        if self.advantage not in ("grpo", "rloo"):
            raise ValueError(f"unknown advantage {self.advantage!r}")
        if self.branch_at_turn < 0:
            raise ValueError("branch_at_turn must be >= 0 (0: no tree rollouts)")
        if self.keep_in_flight and self.branch_at_turn:
            raise ValueError("keep_in_flight does not keep tree rollouts (branch_at_turn)")
        if self.tree_size is not None:
            if not self.branch_at_turn:
                raise ValueError("tree_size sizes tree rollouts: set branch_at_turn too")
            if self.tree_size < 2 or self.num_generations % self.tree_size:
                raise ValueError(
                    f"tree_size {self.tree_size} must be at least 2 and divide "
                    f"num_generations ({self.num_generations})"
                )
            if self.credit == "turn" and self.tree_size < self.num_generations:
                raise ValueError(
                    'credit="turn" and several trees per group (tree_size) both credit '
                    "tokens by turn; use one of them"
                )
        if self.dynamic_sampling_rounds < 1:
            raise ValueError("dynamic_sampling_rounds must be at least 1")
        if self.credit not in ("episode", "turn"):
            raise ValueError(f"unknown credit {self.credit!r}; expected episode or turn")
        if self.credit == "turn" and self.step_rewards != "return":
            raise ValueError(
                f'credit="turn" credits each turn with the step rewards that follow it; '
                f'step_rewards="{self.step_rewards}" would count them twice or not at all: '
                'use step_rewards="return"'
            )
        if self.sandbox is not None and self.sandbox not in BACKENDS:
            raise ValueError(
                f"unknown sandbox {self.sandbox!r}; expected one of {', '.join(BACKENDS)}"
            )
        if self.sandbox_resources is not None and self.sandbox != "ray":
            raise ValueError('sandbox_resources only apply with sandbox="ray"')
        self.compaction()  # refuses a budget or a number of kept turns below 1

    def compaction(self) -> Compaction | None:
        """The rollouts' `Compaction` (`compact_at_tokens` and the fields after it), or None."""
        if self.compact_at_tokens is None:
            return None
        return Compaction(self.compact_at_tokens, self.compact_keep_turns, self.compact_summary)

    def steps_in_flight(self) -> int:
        """How many steps' episodes may play at once: `max_staleness` + 1 with partial
        rollouts, else 1 (what engines' KV caches and sandbox pools are sized for)."""
        return 1 + self.max_staleness if self.partial_rollouts else 1

    def loss_keywords(self) -> dict[str, Any]:
        """The loss's settings as `policy_loss`'s keywords (`LossSettings` fields)."""
        on = self.importance_sampling
        return dict(
            loss_type=self.loss_type,
            clip_low=self.epsilon,
            clip_high=self.clip_high,
            beta=self.beta,
            importance_cap=self.importance_sampling_cap if on else None,
            importance_floor=self.importance_sampling_min if on else None,
            importance_mode=self.importance_sampling_mode,
            ratio_level=self.importance_sampling_level,
            off_policy_threshold=self.off_policy_mask_threshold,
            cispo_cap=self.cispo_cap,
            kl_bias_correction=self.kl_bias_correction,
        )

    def loss_settings(self) -> LossSettings:
        """The loss's settings (checked: unknown names are refused)."""
        from toolgym.algorithms.losses import LossSettings

        return LossSettings(**self.loss_keywords(), temperature=self.temperature)

    @property
    def engine_log_path(self) -> str:
        """The file the engine's log lines go to unless `verbose`."""
        return f"{self.output_dir}/engine.log"

    @property
    def clip_high(self) -> float:
        """The upper clip range in use (`epsilon_high`, else `epsilon`)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        return asdict(self)


TRACKERS = {"trackio": "trackio", "wandb": "wandb", "tensorboard": "tensorboard"}
"""The trackers `report_to` may name, with the module each needs (the extra of the same name
installs it: `pip install "toolgym[wandb]"`)."""


def check_trackers(names: list[str]) -> None:
    """Refuse an unknown tracker, or one whose package is not installed, naming what to do."""
    import importlib.util

    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r} in report_to; use {', '.join(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise ValueError(
                f"report_to names {name!r}, but the {TRACKERS[name]} package is not installed: "
                f'pip install "toolgym[{name}]" (or drop it: metrics.jsonl is always written)'
            )


@dataclass
class RLOOConfig(GRPOConfig):
    """`GRPOConfig` with RLOO's defaults: leave-one-out baseline, no std scaling."""

    output_dir: str = "runs/rloo"
    advantage: Literal["grpo", "rloo"] = "rloo"
    scale_rewards: ScaleRewards = "none"


@dataclass
class SFTConfig:
    """Settings of the supervised warm-up on environment demonstrations."""

    learning_rate: float = 1e-4
    """Peak learning rate of AdamW (linear decay to 0)."""
    epochs: int = 1
    """Passes over the demonstrations."""
    batch_size: int = 8
    """Trajectories per optimizer step."""
    micro_batch_size: int = 2
    """Trajectories per forward/backward pass (gradients accumulate over the step; the loss
    does not depend on it, the peak memory does); 0: the whole step in one pass."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk when computing logprobs."""
    compile_logprobs: bool | None = None
    """See `GRPOConfig.compile_logprobs` (None: on CUDA only)."""
    share_prefix: bool | None = None
    """Compute a pass's common prefix once (see `GRPOConfig.share_prefix`; None: on except
    on CUDA devices). Demonstrations of one task share their prompt and often the expert's
    first turn, so a pass of several costs little more than their own tokens."""
    bf16: bool = False
    """Run forward and backward passes under bfloat16 autocast (see `GRPOConfig.bf16`)."""
    seed: int = 0
    """Seeds the order of the demonstrations."""
