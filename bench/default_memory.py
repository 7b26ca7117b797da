"""Peak memory per stage of a small run at `GRPOConfig()`'s defaults (issue 42 item 6).

The embedded SmolLM2-135M, untrained on the task, plays `GuessNumber-v0` (8 turns) in groups:
4 prompts x 6 generations a step, everything else at `GRPOConfig`'s defaults (the engine named
by `--engine`). The untrained model writes long turns, so episodes run to the turn or length
limit: the shape that once swung a run between 6 and 20 GB within a step and had the kernel
kill it at 24 GB. Prints the stage table (wall time and peak resident memory per stage) and the
episodes' mean length, so that a change to the defaults is measured against the same run.

    python bench/default_memory.py --engine vllm --steps 3
    python bench/default_memory.py --engine hf --steps 2 --set micro_batch_size=4
    python bench/default_memory.py --env Wordle-v0 --prompts 2 --generations 6 --max-turns 10
        # the README's training example (GRPOConfig(prompts_per_step=2, num_generations=6))

`--set name=value` overrides one `GRPOConfig` field (a Python literal), to measure what a
setting does.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import tempfile
from pathlib import Path

import toolgym
from toolgym.agents import AgentLimits
from toolgym.algorithms import GRPOConfig, GRPOTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["hf", "vllm"], default="vllm")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--env", default="GuessNumber-v0")
    parser.add_argument("--prompts", type=int, default=4, help="prompts_per_step")
    parser.add_argument("--generations", type=int, default=6, help="num_generations")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="tokens per turn")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = ast.literal_eval(value)
    output = args.output_dir or tempfile.mkdtemp(prefix="toolgym-default-memory-")
    config = GRPOConfig(
        output_dir=output,
        engine=args.engine,
        max_steps=args.steps,
        prompts_per_step=args.prompts,
        num_generations=args.generations,
        limits=AgentLimits(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens),
        progress_bar=False,
        **overrides,
    )
    rows = toolgym.spec(args.env).dataset(64, seed=0)
    trainer = GRPOTrainer("smollm2-135m", args.env, rows, args=config)
    history = trainer.train()
    print(trainer.stages.table())
    episodes = [json.loads(line) for line in (Path(output) / "samples.jsonl").open()]
    lengths = [
        len(e["samples"][-1]["prompt_ids"]) + len(e["samples"][-1]["completion_ids"])
        for e in episodes
    ]
    print(
        f"{args.env}, engine {args.engine}, {len(history)} steps, {len(episodes)} episodes: mean "
        f"{statistics.fmean(lengths):.0f} tokens (max {max(lengths)}), "
        f"turns {statistics.fmean(m['turns'] for m in history):.1f}, "
        f"settings {overrides or 'defaults'}"
    )


if __name__ == "__main__":
    main()
