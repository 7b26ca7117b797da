"""Two CPU processes under `accelerate launch`: one GRPO group split across them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import run_group

from toolgym.algorithms.advantages import group_advantages

SCRIPT = Path(__file__).parents[1] / "scripts" / "two_process_grpo.py"


def _command(output: Path, *options: str) -> list[str]:
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return [*command, str(SCRIPT), str(output), *options]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def launch(output: Path, *options: str) -> list[dict]:
    done = run_group(_command(output, *options), timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((output / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")
def test_rewards_are_gathered_and_the_group_baseline_spans_both_processes(tmp_path):
    first, second = launch(tmp_path)
    assert first["processes"] == second["processes"] == 2
    # One prompt x 4 generations: rollouts 0-1 ran in process 0, rollouts 2-3 in process 1.
    rewards = first["rewards"] + second["rewards"]
    assert len(rewards) == 4 and len(set(rewards)) > 1
    whole, _ = group_advantages(rewards, [True] * 4, 4, baseline="grpo", scale="group")
    assert first["advantages"] == pytest.approx(whole[:2].tolist(), abs=1e-6)
    assert second["advantages"] == pytest.approx(whole[2:].tolist(), abs=1e-6)
    # A baseline over each process's own half would differ (the test can fail).
    halves, _ = group_advantages(first["rewards"], [True] * 2, 2, baseline="grpo", scale="group")
    assert halves.tolist() != pytest.approx(first["advantages"], abs=1e-3)
    # Both processes log the mean over all four rollouts and hold the same weights after the
    # update (DDP averaged the gradients).
    assert first["step_reward"] == second["step_reward"] == pytest.approx(sum(rewards) / 4)
    assert first["used_everywhere"] == second["used_everywhere"] == 4
    # Each reward source's figure is the mean over both processes' rollouts too (not over the
    # main process's half, as it was: the halves' hashed rewards almost never share a mean).
    sourced = first["completion_rewards"] + second["completion_rewards"]
    logged = first["logged_completion_reward"], second["logged_completion_reward"]
    assert logged[0] == logged[1] == pytest.approx(sum(sourced) / 4)
    assert first["weights"] == pytest.approx(second["weights"], rel=1e-9)


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")
def test_a_run_killed_mid_step_resumes_to_the_same_weights_and_metrics(tmp_path):
    """SIGKILL both processes in the middle of step 2, resume from checkpoint-1: the weights
    and step 2's metrics equal those of a run that was never interrupted (every process's
    random states are in the checkpoint)."""
    whole = launch(tmp_path / "whole", "2")
    killed = tmp_path / "killed"
    run = subprocess.Popen(
        _command(killed, "2", "--hang-at", "2"),
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (killed / "hanging").exists():
            assert run.poll() is None and time.monotonic() < deadline, (
                "the run did not get to step 2"
            )
            time.sleep(0.5)
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the launcher; each rank has a session of its own
        run.wait()
    # the ranks notice their launcher is gone and exit (before: both blocked, ~580 MB each)
    deadline = time.monotonic() + 20
    while _ranks_of(killed) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _ranks_of(killed)
    for pid in left:  # never left behind, even when this fails
        os.kill(pid, signal.SIGKILL)
    assert not left, "a rank outlived its killed launcher"
    assert (killed / "checkpoint-1" / "rng-1.pt").exists()
    resumed = launch(killed, "2", "--resume", str(killed / "checkpoint-1"))
    for rank in (0, 1):
        assert resumed[rank]["weights"] == pytest.approx(whole[rank]["weights"], rel=1e-9)
        assert resumed[rank]["step_rewards"]["2"] == whole[rank]["step_rewards"]["2"]
        assert resumed[rank]["advantages"] == pytest.approx(whole[rank]["advantages"])


def _ranks_of(output: Path) -> list[int]:
    """The live processes of a run writing to `output` (its path is on their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(output).encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
