"""The flagship run's time and memory: runs `examples/wordle.py` and prints its stage table
(wall seconds and peak resident memory per stage, from the run's `stages.json`), then
`peak R GB (limit 8 GB)` as the last line; exits 1 when the peak is over the limit.

By default a shortened run that keeps every memory driver of the default one: the warm-up's
micro-batches (one optimizer step of 8 games), the KV cache sized for 32 evaluation games, 32
greedy and 32 sampled evaluation games before and after, and 2 GRPO steps of the default
size. About 6 minutes on 2 cores. `--full` runs the default command itself (30 minutes).

    python bench/flagship.py [--full] [--limit-gb 8]
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="the default run, 30 minutes")
    parser.add_argument("--limit-gb", type=float, default=8.0)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="toolgym-flagship-"))
    command = [sys.executable, str(ROOT / "examples" / "wordle.py"), "--output-dir", str(out)]
    subprocess.run(command + ([] if args.full else SHORT), check=True)
    stages = json.loads((out / "stages.json").read_text())
    print(f"\n{'stage':<16} {'calls':>5} {'seconds':>9} {'peak GB':>8}")
    for name, record in stages["stages"].items():
        print(
            f"{name:<16} {record['calls']:>5} {record['seconds']:>9.1f} "
            f"{record['peak_bytes'] / 1e9:>8.2f}"
        )
    peak = stages["peak_rss_bytes"] / 1e9
    print(f"whole run {stages['total_seconds']:.0f} s")
    print(f"peak {peak:.2f} GB (limit {args.limit_gb:g} GB)")
    sys.exit(0 if peak <= args.limit_gb else 1)


if __name__ == "__main__":
    main()
