"""The flagship run's time and memory: runs `examples/wordle.py` and prints its stage table
(wall seconds and peak resident memory per stage, from the run's `stages.json`), the update's
share of the GRPO steps, then `peak R GB (limit 8 GB)` as the last line; exits 1 when the peak
is over the limit.

By default a shortened run that keeps every memory driver of the default one: the warm-up's
micro-batches (one optimizer step of 8 games), the default evaluation (64 games sampled
before and after, with the default KV cache), and 2 GRPO steps of the default size. About
6 minutes on 2 cores. `--full` runs the default command itself (30 minutes).
`--compare` runs the shortened run twice, first with the update as it was before the fused
loss and prefix sharing (`--loss-impl chunked --no-share-prefix --micro-batch-size 2`), then
as it is, and ends with the update's time and share before and after and both peaks.

    python bench/flagship.py [--full | --compare] [--limit-gb 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHORT = ["--warmup-games", "8", "--steps", "2", "--time-budget", "0", "--no-cache"]
BEFORE = ["--loss-impl", "chunked", "--no-share-prefix", "--micro-batch-size", "2"]
STEP_STAGES = ("rollouts", "update", "weight sync")


def run(extra: list[str]) -> dict:
    """One run of the example with `extra` arguments; its stages.json."""
    out = Path(tempfile.mkdtemp(prefix="toolgym-flagship-"))
    command = [sys.executable, str(ROOT / "examples" / "wordle.py"), "--output-dir", str(out)]
    subprocess.run(command + extra, check=True)
    return json.loads((out / "stages.json").read_text())


def report(stages: dict) -> tuple[float, float, float]:
    """Print the stage table; returns (update seconds, its share of the steps, peak GB)."""
    print(f"\n{'stage':<16} {'calls':>5} {'seconds':>9} {'peak GB':>8}")
    for name, record in stages["stages"].items():
        print(
            f"{name:<16} {record['calls']:>5} {record['seconds']:>9.1f} "
            f"{record['peak_bytes'] / 1e9:>8.2f}"
        )
    seconds = {name: stages["stages"].get(name, {}).get("seconds", 0.0) for name in STEP_STAGES}
    update, steps = seconds["update"], sum(seconds.values())
    share = update / steps if steps else 0.0
    print(f"whole run {stages['total_seconds']:.0f} s")
    print(f"update {update:.1f} s of {steps:.1f} s in GRPO steps ({share:.0%})")
    return update, share, stages["peak_rss_bytes"] / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="the default run, 30 minutes")
    mode.add_argument("--compare", action="store_true", help="the update before and after")
    parser.add_argument("--limit-gb", type=float, default=8.0)
    args = parser.parse_args()
    if args.compare:
        print("before: " + " ".join(BEFORE))
        before = report(run(SHORT + BEFORE))
        print("\nafter: the defaults")
        after = report(run(SHORT))
        print(
            f"\nupdate {before[0]:.1f} s -> {after[0]:.1f} s (x{before[0] / after[0]:.2f}), "
            f"share of the steps {before[1]:.0%} -> {after[1]:.0%}, "
            f"peak {before[2]:.2f} -> {after[2]:.2f} GB"
        )
        peak = after[2]
    else:
        peak = report(run([] if args.full else SHORT))[2]
    print(f"peak {peak:.2f} GB (limit {args.limit_gb:g} GB)")
    sys.exit(0 if peak <= args.limit_gb else 1)


if __name__ == "__main__":
    main()
