"""The bench scripts keep running as the code under them changes (their figures are not
asserted: speed is measured by the scripts, never by tests)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.slow
def test_train_step_bench_measures_one_toolgym_update(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import train_step

    args = argparse.Namespace(
        arm="toolgym",
        preset="small",
        dtype="float32",
        device="cpu",
        batch=2,
        prompt=16,
        completion=64,
        repeats=1,
        chunk=32,
        loss_impl="auto",
        compile_model="off",
        shared_prompt=True,  # one GRPO group: the update shares the prompt on this CPU
        no_share_prefix=False,
        gradient_checkpointing=True,
    )
    result = train_step.measure(args)
    assert result["seconds"] > 0 and math.isfinite(result["tokens_per_s"])
    assert result["peak_mib"] > 0
    sys.modules.pop("train_step", None)


@pytest.mark.slow
def test_sharding_bench_runs_both_arms_on_two_processes():
    """DDP and FSDP2 over two CPU processes each (a short step; every process gone after)."""
    import re

    from helpers import run_group

    command = [sys.executable, str(BENCH / "sharding.py"), "--episodes", "2"]
    command += ["--prompt", "16", "--completion", "16", "--repeats", "0"]
    done = run_group(command, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[1].startswith("DDP: process 0") and lines[2].startswith("FSDP2: process 0")
    assert re.fullmatch(r"FSDP2/DDP peak growth [0-9.]+, speed [0-9.]+", lines[-1]), lines


@pytest.mark.slow
def test_forks_bench_runs_locally():
    import subprocess

    command = [sys.executable, str(BENCH / "forks.py"), "--backends", "local"]
    done = subprocess.run(
        [*command, "--forks", "3", "--megabytes", "1"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Wordle, local" in done.stdout and "fork     median" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("env", ["wordle", "repl"])
def test_tree_rollouts_bench_runs_both_arms(env):
    import subprocess

    command = [sys.executable, str(BENCH / "tree_rollouts.py"), "--tiny", "--groups", "2"]
    command += ["--env", env, "--sandbox", "local"]
    done = subprocess.run(
        [*command, "--generations", "2", "--at-turn", "1"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "independent " in done.stdout and "tree / independent:" in done.stdout


def test_judges_bench_prints_each_bound_against_the_model_alone():
    import subprocess

    command = [sys.executable, str(BENCH / "judges.py"), "--episodes", "8", "--delays", "0.01"]
    done = subprocess.run([*command, "--bounds", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "max_concurrency 2: 8 episodes" in done.stdout and "x the model alone" in done.stdout
