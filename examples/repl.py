"""Train an agent to solve word problems by writing Python line by line in a live REPL.

The inline protocol (`PythonLines-v0`): the model writes one assistant turn, each line runs in
a sandboxed Python session the moment it ends, and its output is appended inline before the
model writes the next line. A line that raises costs -0.3 (a per-step reward, added to the
episode's return), and `submit(<expression>)` ends the episode with reward 1 if the value is
right. With no arguments this runs on the CPU with SmolLM2-135M-Instruct: a supervised warm-up
on the environment's own solutions, an evaluation on held-out problems (greedy and sampled),
GRPO under a time budget (20 minutes for the whole run by default), the same evaluation again,
and a summary: success, reward, and the share of lines that raise, before and after.

    python examples/repl.py              # CPU default
    python examples/repl.py --quick      # a few small steps, for smoke tests
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

from wordle import apply_budget, fast_bf16, paired_difference, parse_duration

from toolgym.agents import AgentLimits
from toolgym.agents.trajectory import load_jsonl
from toolgym.algorithms import GRPOConfig, GRPOTrainer, SFTConfig, default_cache_dir
from toolgym.builtin_envs.python_lines import python_lines_dataset


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--engine", default="vllm" if importlib.util.find_spec("vllm") else "hf",
        choices=["hf", "vllm", "vllm-server"],
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=100, help="GRPO steps at most")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--warmup-problems", type=int, default=48, help="expert solutions")
    parser.add_argument("--eval-problems", type=int, default=32)
    parser.add_argument("--sandbox", default="process", help="process, docker, auto or local")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=fast_bf16())
    parser.add_argument(
        "--step-rewards", default="return", choices=["return", "tokens", "ignore"],
        help="where a raising line's -0.3 goes: the whole episode's return, or that line's tokens",
    )  # fmt: skip
    parser.add_argument(
        "--max-staleness", type=int, default=0,
        help="policy versions an episode may lag (partial rollouts; vLLM engines only)",
    )  # fmt: skip
    parser.add_argument(
        "--branch-at-turn", type=int, default=0,
        help="play each group as a tree branching after this many lines (0: independent)",
    )  # fmt: skip
    parser.add_argument(
        "--tree-size", type=int, default=None,
        help="with --branch-at-turn: episodes per tree, several trees a group whose shared "
        "lines train against the other trees' (default: one tree a group)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/repl")
    parser.add_argument("--time-budget", type=parse_duration, default="20m")
    parser.add_argument("--no-cache", action="store_true", help="do not use the warm-up cache")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM's log lines in the terminal (default: OUTPUT_DIR/engine.log)",
    )
    parser.add_argument("--quick", action="store_true", help="a few small steps (smoke test)")
    return parser


def config_from(args: argparse.Namespace) -> GRPOConfig:
    return GRPOConfig(
        output_dir=args.output_dir,
        seed=args.seed,
        engine=args.engine,
        learning_rate=args.learning_rate,
        max_steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations,
        micro_batch_size=2,
        bf16=args.bf16,
        gradient_checkpointing=True,
        limits=AgentLimits(max_turns=10, max_new_tokens=32, max_episode_tokens=320),
        temperature=1.0,
        sandbox=args.sandbox,
        step_rewards=args.step_rewards,
        max_staleness=args.max_staleness,
        branch_at_turn=args.branch_at_turn,
        tree_size=args.tree_size,
        save_steps=0,
        verbose=args.verbose,
    )


def evaluate(trainer: GRPOTrainer, stage: str) -> dict[str, dict]:
    """Held-out problems, greedy and sampled: success, reward, and lines that raise. Sampling
    is seeded per problem and line, the same before and after (common random numbers)."""
    figures = {}
    for mode, temperature in (("greedy", 0.0), ("sampled", trainer.args.temperature)):
        samples = f"eval-{stage}-{mode}.jsonl"
        summary = trainer.evaluate(
            temperature=temperature, samples_file=samples, seed=trainer.args.seed
        )
        episodes = load_jsonl(Path(trainer.args.output_dir) / samples)
        lines = sum(e.metrics["tool_calls"] for e in episodes)
        raised = sum(e.metrics["tool_failures"] for e in episodes)
        summary["lines"] = lines / len(episodes)
        summary["raising_share"] = raised / lines if lines else 0.0
        summary["solved"] = [float(e.reward > 0.5) for e in episodes]  # a right submit()
        summary["rewards"] = [e.reward for e in episodes]
        figures[mode] = summary
        print(
            f"{stage} GRPO ({mode}): solved {statistics.mean(summary['solved']):.1%}, "
            f"reward {summary['reward']:.3f}, lines that raise {summary['raising_share']:.1%}"
        )
    return figures


def summary_table(before: dict[str, dict], after: dict[str, dict]) -> str:
    lines = [
        f"{'held-out problems':<18} {'solved':>7} {'reward':>16} {'lines':>6} {'raise':>6}"
        "  statuses"
    ]
    for mode in ("greedy", "sampled"):
        for stage, f in (("before", before[mode]), ("after", after[mode])):
            solved = statistics.mean(f["solved"])
            lines.append(
                f"{mode + ' ' + stage:<18} {solved:>7.1%} {f['reward']:>16.3f} {f['lines']:>6.2f} "
                f"{f['raising_share']:>6.1%}  {f['statuses']}"
            )
        mean, error = paired_difference(before[mode]["rewards"], after[mode]["rewards"])
        lines.append(f"{mode + ' change':<18} {'':>7} {f'{mean:+.3f} ± {error:.3f}':>16}")
    lines.append(
        "(lines: lines run per problem; raise: share of them that raised or did not compile; "
        "change: after - before, paired by problem, ± one standard error)"
    )
    return "\n".join(lines)


def main() -> None:
    args = build_parser().parse_args()
    if args.quick:
        args.steps, args.prompts_per_step, args.num_generations = 2, 1, 2
        args.warmup_problems, args.eval_problems, args.time_budget = 8, 2, 0
    started = time.perf_counter()
    trainer = GRPOTrainer(
        args.model,
        "PythonLines-v0",
        python_lines_dataset(2000, seed=args.seed + 100),
        args=config_from(args),
        eval_dataset=python_lines_dataset(args.eval_problems, seed=10_000 + args.seed),
    )
    if args.warmup_problems:
        sft = SFTConfig(learning_rate=1e-4, batch_size=8, micro_batch_size=2, bf16=args.bf16)
        demos = python_lines_dataset(args.warmup_problems, seed=7)
        cache = None if args.no_cache else default_cache_dir()
        losses = trainer.warmup(demos, sft, cache_dir=cache)
        where = "loaded from the cache" if trainer.warmup_cached_from else "trained"
        print(
            f"warm-up on {len(demos)} solutions, {where}: loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        )
    before = evaluate(trainer, "before")
    if args.time_budget:
        apply_budget(trainer, args.time_budget, time.perf_counter() - started)
    trainer.train()
    print(f"GRPO: {trainer.step} steps ({trainer.stopped_by})")
    after = evaluate(trainer, "after")
    out = Path(trainer.args.output_dir)
    (out / "evaluation.json").write_text(json.dumps({"before": before, "after": after}, indent=2))
    trainer.stages.save(out / "stages.json")
    print("\n" + summary_table(before, after))
    print("\n" + trainer.stages.table())
    print(f"\nwall time {time.perf_counter() - started:.0f} s; samples and metrics in {out}")
    print(f"episodes: toolgym view {out}")


if __name__ == "__main__":
    main()
