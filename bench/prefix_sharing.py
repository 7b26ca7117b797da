"""Time and peak memory of one GRPO update with and without the shared prompt prefix.

The flagship's step, in shape: SmolLM2-135M (real weights), 8 episodes that open with the same
268-token prompt (system prompt, tool schema, task), each followed by about 452 tokens (362 to
542) in which the model's turns alternate with tool results (48 sampled, 16 observation
tokens), gradient checkpointing on and bfloat16 autocast where the hardware has it, as
`examples/wordle.py` runs.
Arms: `GRPOConfig.share_prefix` off (the peer: every row computes the prompt) and on, at
micro-batches of 2 (the example's setting before) and 8 (the whole step in one pass). Each arm
runs in a fresh process (peak memory: growth of the peak resident set over the steps, the
optimizer's state included).

    python bench/prefix_sharing.py --repeats 2
    python bench/prefix_sharing.py --micro-batches 4

The last line: `shared/plain speed S at micro-batch M, peak growth P` for the largest
micro-batch (S: the plain arm's step time over the shared arm's).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from run_folder import run_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def trajectories(args, vocabulary: int) -> list:
    """`args.episodes` episodes: the shared prompt, then about `args.completion` tokens each
    (lengths spread by a fifth either way, as played episodes are, so rows are padded)."""
    from toolgym.agents.trajectory import Sample, Trajectory

    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocabulary, (args.prompt,), generator=generator).tolist()
    period = 48 + 16
    played = []
    for _ in range(args.episodes):
        low, high = -(args.completion // 5), args.completion // 5 + 1
        spread = int(torch.randint(low, high, (1,), generator=generator))
        length = args.completion + spread
        completion = torch.randint(0, vocabulary, (length,), generator=generator).tolist()
        sampled = [int(i % period < 48) for i in range(length)]
        played.append(Trajectory([Sample(prompt, completion, sampled, [0.0] * length)]))
    return played


def measure(args) -> dict:
    from train_step import build_model, resident_bytes
    from wordle import fast_bf16

    from toolgym.algorithms import GRPOConfig, GRPOTrainer
    from toolgym.testing import tiny_tokenizer

    model = build_model("smollm2-135m", torch.float32, "cpu")
    config = GRPOConfig(
        output_dir=run_folder("toolgym-bench-"),
        micro_batch_size=args.micro_batch,
        share_prefix=args.share,
        gradient_checkpointing=True,
        bf16=fast_bf16(),
        limits={"max_episode_tokens": args.prompt + args.completion},
        beta=0.0,
        learning_rate=1e-6,
        progress_bar=False,
    )
    trainer = GRPOTrainer(
        model, "Wordle-v0", [{"answer": "crane"}], args=config, tokenizer=tiny_tokenizer()
    )
    played = trajectories(args, model.config.vocab_size)
    advantages = torch.randn(len(played), generator=torch.Generator().manual_seed(2))
    used = torch.ones(len(played), dtype=torch.bool)
    base = resident_bytes()
    times = []
    for _ in range(1 + args.repeats):  # the first step allocates the optimizer's state
        start = time.perf_counter()
        trainer.learner.update(played, advantages, used, len(played))
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"seconds": statistics.median(times[1:] or times), "peak_mib": peak / 2**20}


def run_arm(args, micro_batch: int, share: bool) -> dict:
    command = [sys.executable, __file__, "--arm", "--micro-batch", str(micro_batch)]
    command += ["--share" if share else "--no-share"]
    for name in ("episodes", "prompt", "completion", "repeats"):
        command += [f"--{name}", str(getattr(args, name))]
    from train_step import run_json

    return run_json(command)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8, help="trajectories per step")
    parser.add_argument("--prompt", type=int, default=268, help="shared prompt tokens")
    parser.add_argument("--completion", type=int, default=452, help="tokens after the prompt")
    parser.add_argument("--micro-batches", default="2,4,8", help="micro-batch sizes to run")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps after the first")
    parser.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--micro-batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--share", action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(measure(args)))
        return
    print(
        f"SmolLM2-135M, {args.episodes} episodes x ({args.prompt} shared + {args.completion}) "
        f"tokens, gradient checkpointing, median of {args.repeats} after the first",
        flush=True,
    )
    last = None
    for size in (int(s) for s in args.micro_batches.split(",")):
        arms = {share: run_arm(args, size, share) for share in (False, True)}
        line = [f"micro-batch {size}:"]
        for share, r in arms.items():
            name = "shared" if share else "plain"
            if "error" in r:
                line.append(f"{name} failed ({r['error']})")
            else:
                line.append(f"{name} {r['seconds']:.2f} s, peak +{r['peak_mib']:.0f} MiB")
        if all("error" not in r for r in arms.values()):
            plain, shared = arms[False], arms[True]
            last = (plain["seconds"] / shared["seconds"], size, shared["peak_mib"])
            line.append(f"-> x{last[0]:.2f}")
        print("  ".join(line), flush=True)
    if last is not None:
        print(
            f"shared/plain speed {last[0]:.2f} at micro-batch {last[1]}, "
            f"peak growth {last[2]:.0f} MiB"
        )


if __name__ == "__main__":
    main()
