"""Per-process memory and time of one GRPO update on two CPU processes: DDP against FSDP2.

SmolLM2-135M (real weights, float32), the flagship's step in shape (8 episodes of a shared
268-token prompt and about 452 more tokens, `bench/prefix_sharing.py`'s), 4 a process,
micro-batches of 2, gradient checkpointing, no KL reference and a server engine (so neither
arm keeps a full copy besides the policy). Each arm is one `accelerate launch
--num_processes 2` (gloo): `--multi_gpu` (DDP, the peer) and `--use_fsdp --fsdp_version 2`
(the policy sharded over both processes, `toolgym.algorithms.sharding`). Each process loads
the model after its Accelerator, as `toolgym train` does, and reports the growth of its peak
resident set over the updates (the gradients and AdamW's state included: DDP holds them in
full in each process, FSDP2 half) and the median update time after the first.

    python bench/sharding.py --repeats 2

The last line: `FSDP2/DDP peak growth M, speed S` (M: FSDP2's largest per-process peak
growth over DDP's; S: DDP's update time over FSDP2's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from run_folder import run_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))

ARMS = {"DDP": ["--multi_gpu"], "FSDP2": ["--use_fsdp", "--fsdp_version", "2"]}


def measure(args) -> dict:
    """One process of an arm: its half of the episodes, `1 + repeats` updates."""
    from accelerate import Accelerator
    from prefix_sharing import trajectories
    from train_step import build_model, resident_bytes

    from toolgym.algorithms import GRPOConfig
    from toolgym.algorithms.learner import Learner

    accelerator = Accelerator(cpu=True)
    model = build_model("smollm2-135m", torch.float32, "cpu")
    config = GRPOConfig(
        output_dir=run_folder("toolgym-bench-"),
        engine="vllm-server",  # no replica under FSDP2; the Learner starts no engine
        micro_batch_size=2,
        gradient_checkpointing=True,
        limits={"max_episode_tokens": args.prompt + args.completion},
        beta=0.0,
        learning_rate=1e-6,
        progress_bar=False,
    )
    learner = Learner(model, config, accelerator, pad_id=0)
    played = trajectories(args, model.config.vocab_size)
    half = len(played) // accelerator.num_processes
    mine = played[accelerator.process_index * half : (accelerator.process_index + 1) * half]
    advantages = torch.randn(len(played), generator=torch.Generator().manual_seed(2))
    advantages = advantages[accelerator.process_index * half :][:half]
    used = torch.ones(half, dtype=torch.bool)
    base = resident_bytes()
    times = []
    for _ in range(1 + args.repeats):  # the first step allocates the optimizer's state
        start = time.perf_counter()
        learner.update(mine, advantages, used, len(played))
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    accelerator.wait_for_everyone()
    return {
        "rank": accelerator.process_index,
        "sharded": learner.sharded,
        "seconds": statistics.median(times[1:] or times),
        "growth_mib": (peak - base) / 2**20,
        "peak_mib": peak / 2**20,
    }


def run_arm(args, name: str) -> list[dict]:
    """Both processes of one arm; their figures (or one `{"error": ...}`)."""
    accelerate = Path(sys.executable).with_name("accelerate")
    with tempfile.TemporaryDirectory() as folder:
        command = [str(accelerate), "launch", "--num_processes", "2", *ARMS[name]]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += [__file__, "--arm", "--output", folder]
        for option in ("episodes", "prompt", "completion", "repeats"):
            command += [f"--{option}", str(getattr(args, option))]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode != 0:
            return [{"error": done.stderr.strip().splitlines()[-1:] or ["no output"]}]
        return [json.loads(path.read_text()) for path in sorted(Path(folder).glob("*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8, help="trajectories per step")
    parser.add_argument("--prompt", type=int, default=268, help="shared prompt tokens")
    parser.add_argument("--completion", type=int, default=452, help="tokens after the prompt")
    parser.add_argument("--repeats", type=int, default=1, help="timed updates after the first")
    parser.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        torch.set_num_threads(1)
        figures = measure(args)
        Path(args.output, f"rank{figures['rank']}.json").write_text(json.dumps(figures))
        return
    print(
        f"SmolLM2-135M, {args.episodes} episodes x ({args.prompt} shared + {args.completion}) "
        f"tokens over 2 processes, median of {args.repeats} after the first",
        flush=True,
    )
    arms = {name: run_arm(args, name) for name in ARMS}
    for name, ranks in arms.items():
        if "error" in ranks[0]:
            print(f"{name}: failed ({ranks[0]['error']})", flush=True)
            continue
        cells = [
            f"process {r['rank']} {r['seconds']:.2f} s, peak +{r['growth_mib']:.0f} MiB "
            f"({r['peak_mib']:.0f} MiB)"
            for r in ranks
        ]
        print(f"{name}: " + "; ".join(cells), flush=True)
    if all("error" not in ranks[0] for ranks in arms.values()):
        growth = {name: max(r["growth_mib"] for r in ranks) for name, ranks in arms.items()}
        seconds = {name: max(r["seconds"] for r in ranks) for name, ranks in arms.items()}
        print(
            f"FSDP2/DDP peak growth {growth['FSDP2'] / growth['DDP']:.2f}, "
            f"speed {seconds['DDP'] / seconds['FSDP2']:.2f}"
        )


if __name__ == "__main__":
    main()
