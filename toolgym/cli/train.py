"""`toolgym train`: GRPO or RLOO from the command line, every `GRPOConfig` field a flag.

The flags of the config are generated from the dataclass (`toolgym.cli.config_args`), so a
field added to `GRPOConfig` is a flag at once. Under `accelerate launch -m toolgym train ...`
each process runs this command; the trainer splits the rollouts between them and only the
main process writes the logs and prints.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from toolgym.cli.config_args import add_config_arguments, resolve_config
from toolgym.cli.env_spec import ResolvedEnv, read_rows, resolve_env
from toolgym.cli.episodes import add_env_arguments
from toolgym.cli.errors import CLIError
from toolgym.cli.multinode import refuse_fsdp, weights_agree

DESCRIPTION = """\
Train MODEL against ENV with GRPO (or RLOO) and write metrics, samples, checkpoints and a
reward plot to --output-dir. Every GRPOConfig field is a flag below; a --config file (YAML or
JSON, the same field names; nested limits as `limits: {max_turns: 4}` or flat) sets them too.
Precedence: field default < --config file < flag. With --algorithm rloo the defaults are
RLOOConfig's (output_dir runs/rloo, advantage rloo, scale_rewards none).

examples:
  toolgym train Wordle-v0 --model smollm2-135m --max-steps 30 --num-generations 6
  toolgym train envs.py:Countdown --model ./my-model --dataset rows.jsonl --config run.yaml
  accelerate launch --num_processes 2 -m toolgym train Wordle-v0 --model smollm2-135m
  accelerate launch --config_file "$(toolgym accelerate-config multi-node-ddp)" \
      --machine_rank 0 --main_process_ip HEAD -m toolgym train Wordle-v0 --model ...
"""

CONFIG_FILE_NAME = "train_config.json"
"""The resolved settings, written to the output folder (reusable with `--config`)."""


def add_train_command(commands: Any, with_config_flags: bool = True) -> None:
    """The `train` subcommand; `with_config_flags=False` leaves out the generated flags (and
    the import of the trainer they need), for commands other than `train`."""
    parser = commands.add_parser(
        "train",
        help="train a model against an environment (GRPO or RLOO)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_env_arguments(parser)
    parser.add_argument("--model", required=True, help="hub id, folder, or smollm2-135m")
    parser.add_argument("--algorithm", choices=["grpo", "rloo"], default="grpo")
    parser.add_argument("--config", metavar="FILE", help="GRPOConfig fields in YAML or JSON")
    parser.add_argument(
        "--dataset-size",
        type=int,
        metavar="N",
        help="rows drawn from the environment's dataset builder when no --dataset is given "
        "(default: prompts_per_step x max_steps)",
    )
    parser.add_argument("--split", help="dataset split of the training rows, for builders")
    parser.add_argument("--eval-dataset", metavar="FILE.jsonl", help="evaluation prompt rows")
    parser.add_argument(
        "--eval-size", type=int, default=0, metavar="N", help="evaluation rows from the builder"
    )
    parser.add_argument("--eval-split", help="dataset split of the evaluation rows")
    parser.add_argument("--resume", metavar="CHECKPOINT", help="continue from this checkpoint")
    if with_config_flags:
        from toolgym.algorithms.config import GRPOConfig

        add_config_arguments(parser, GRPOConfig)
    parser.set_defaults(handler=train)


def train(args: argparse.Namespace) -> int:
    """`toolgym train`: build the config, the data and the trainer, train, say where the
    results went; with several processes, also whether they all hold the same weights (the
    main process exits with 1 when not)."""
    refuse_fsdp()  # before anything loads, in every process
    import toolgym.algorithms as algorithms

    config_class = algorithms.RLOOConfig if args.algorithm == "rloo" else algorithms.GRPOConfig
    config = resolve_config(config_class, args.config, args)
    env_spec = resolve_env(args.env)
    rows = training_rows(args, env_spec, config)
    eval_rows = evaluation_rows(args, env_spec, config)
    env, env_kwargs = env_spec.trainer_env(args.env_kwargs)
    trainer_class = algorithms.RLOOTrainer if args.algorithm == "rloo" else algorithms.GRPOTrainer
    try:
        trainer = trainer_class(
            args.model, env, rows, args=config, eval_dataset=eval_rows, env_kwargs=env_kwargs
        )
    except ValueError as error:  # settings that do not go together, an empty dataset
        raise CLIError(str(error)) from None
    main_process = trainer.accelerator.is_main_process
    if main_process:
        output = Path(config.output_dir)
        output.mkdir(parents=True, exist_ok=True)
        (output / CONFIG_FILE_NAME).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    started = time.perf_counter()
    try:
        history = trainer.train(resume_from_checkpoint=args.resume)
    finally:
        trainer.close()  # a --sandbox ray pool's actors
    if main_process:
        print(report(trainer, history, time.perf_counter() - started))
    agreement = weights_agree(trainer) if trainer.accelerator.num_processes > 1 else None
    if agreement is not None:  # the main process of several: DDP keeps every copy equal
        print(agreement[1], flush=True)
    _leave_process_group(trainer)
    return 1 if agreement is not None and not agreement[0] else 0


def training_rows(args: argparse.Namespace, env: ResolvedEnv, config: Any) -> list[dict]:
    """`--dataset`'s rows, else `--dataset-size` rows from the environment's builder."""
    if args.dataset:
        return read_rows(args.dataset)
    count = args.dataset_size or max(1, config.prompts_per_step * config.max_steps)
    kwargs = {"split": args.split} if args.split else {}
    return env.dataset(count, seed=config.seed, **kwargs)


def evaluation_rows(args: argparse.Namespace, env: ResolvedEnv, config: Any) -> list | None:
    """`--eval-dataset`'s rows, else `--eval-size` rows from the builder, else None."""
    if args.eval_dataset:
        return read_rows(args.eval_dataset)
    if not args.eval_size:
        return None
    kwargs = {"split": args.eval_split} if args.eval_split else {}
    return env.dataset(args.eval_size, seed=config.seed + 1, **kwargs)


def report(trainer: Any, history: list[dict[str, Any]], seconds: float) -> str:
    """What training did and where each of its files is."""
    output = Path(trainer.args.output_dir)
    steps = len(history)
    lines = [f"trained {steps} step{'s' * (steps != 1)} in {seconds:.1f} s"]
    if trainer.stopped_by:
        lines[0] += f" (stopped by {trainer.stopped_by})"
    if history:
        last = history[-1]
        lines[0] += f"; last step: reward {last['reward']:.3f}, success {last['success_rate']:.0%}"
    files = [
        ("metrics", output / "metrics.jsonl"),
        ("samples", output / "samples.jsonl"),
        ("checkpoint", output / f"checkpoint-{trainer.step}"),
        ("reward plot", output / "rewards.png"),
        ("stage times", output / "stages.json"),
        ("settings", output / CONFIG_FILE_NAME),
    ]
    lines += [f"  {name:12} {path}" for name, path in files if path.exists()]
    lines.append(f"look at the episodes: toolgym view {output}")
    return "\n".join(lines)


def _leave_process_group(trainer: Any) -> None:
    """Tear a distributed run's process group down before exit: left to interpreter shutdown,
    gloo's threads can abort the process after the work is done."""
    import torch

    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
