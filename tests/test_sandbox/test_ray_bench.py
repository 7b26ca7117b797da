"""`bench/cluster.py` keeps running as the code under it changes: a tiny size on its own
local two-node cluster (the figures are printed by the script, never asserted here), and
nothing of the cluster is left behind.

Skips as `test_ray_backend.py` does (no Ray, no bubblewrap) unless TOOLGYM_REQUIRE_SANDBOXES=1.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import test_ray_backend  # noqa: F401  (skips without Ray or bubblewrap)

BENCH = Path(__file__).resolve().parents[2] / "bench"
pytestmark = pytest.mark.slow


def test_the_cluster_bench_plays_every_episode_and_cleans_up(monkeypatch, capsys):
    import ray

    if ray.is_initialized():
        pytest.skip("Ray is initialised in this process already")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")  # the bench sets its own; restored after
    monkeypatch.syspath_prepend(str(BENCH))
    import cluster

    try:
        argv = ["--episodes", "6", "--per-actor", "3", "--calls", "2", "--process-size", "2"]
        lines = cluster.main(argv)
    finally:
        sys.modules.pop("cluster", None)
    text = "\n".join(lines)
    assert "ACTORS LEFT" not in text
    assert "statuses {'finished': 6}" in text, text
    assert text.count("statuses {'finished': 6}") == 4  # Ray (all at once, paced), process, local
    assert re.fullmatch(r"episodes/s [0-9.]+, overhead p99 [0-9.]+ ms", lines[-1]), lines[-1]
    assert not ray.is_initialized()
    leftovers = [line for line in Path("/proc").glob("[0-9]*") if _ours(line)]
    assert not leftovers, leftovers


def _ours(process: Path) -> bool:
    try:
        environ = (process / "environ").read_bytes()
    except OSError:
        return False
    return any(item.startswith(b"RAY_TMPDIR=/tmp/tgbench") for item in environ.split(b"\0"))
