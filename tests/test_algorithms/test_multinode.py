"""The shipped accelerate configs (`toolgym accelerate-config`) run as a simulated two-machine
cluster on loopback: two `accelerate launch --config_file <shipped file> --machine_rank 0|1
--num_machines 2 --num_processes 2 -m toolgym train ...` launchers of one process each (gloo on
the CPU), each "machine" its own launcher, rendezvous through 127.0.0.1 on a free port."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import run_group
from safetensors.torch import load_file
from test_distributed import _ranks_of

from toolgym.cli import main
from toolgym.cli.multinode import config_names, config_path

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")

BABBLE_ENV = '''
import zlib

import toolgym


class Babble(toolgym.Environment):
    """Scores the first piece of text the model writes (up to a common letter) by a hash of
    it: rewards differ from rollout to rollout even for a random model."""

    inline_markers = ("e", "a", "o", "t", " ")

    def inline_step(self, text: str) -> None:
        self.reward = (zlib.crc32(text.encode()) % 101) / 100
        self.done = True
'''

ROWS = [{"prompt": "Say something."}, {"prompt": "Say anything."}]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model and its tokenizer, saved as a folder."""
    from toolgym.testing import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer, seed=3).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def babble(tmp_path: Path) -> tuple[Path, Path]:
    """The environment file and its dataset."""
    env_file = tmp_path / "babble_env.py"
    env_file.write_text(BABBLE_ENV)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return env_file, rows


def free_port() -> int:
    """A TCP port nothing listens on now (the main machine's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launcher(config: str, rank: int, port: int, train: list[str]) -> list[str]:
    """One simulated machine: `accelerate launch` of the shipped `config` with the fields a
    user changes given as flags, then `-m toolgym train`."""
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--config_file", str(config_path(config))]
    command += ["--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"]
    command += ["--main_process_port", str(port), "--num_machines", "2", "--num_processes", "2"]
    return [*command, "-m", "toolgym", "train", *train]


def train_args(babble: tuple[Path, Path], model: Path, output: Path, *extra: str) -> list[str]:
    """One prompt x 4 generations a step (2 rollouts a process), checkpoints every step."""
    env_file, rows = babble
    return [
        f"{env_file}:Babble",
        "--model", str(model), "--dataset", str(rows), "--engine", "hf",
        "--prompts-per-step", "1", "--num-generations", "4", "--micro-batch-size", "2",
        "--max-turns", "2", "--max-new-tokens", "12", "--max-episode-tokens", "300",
        "--learning-rate", "1e-2", "--save-steps", "1", "--no-progress-bar",
        "--batch-wait", "60",  # batches that do not depend on timing: a resume samples the same
        "--output-dir", str(output), *extra,
    ]  # fmt: skip


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cluster(config: str, train: list[str], timeout: float = 240) -> list:
    """Both machines' launchers at once, each through `run_group` (every process it started
    is gone when it returns); their results, machine 0 first."""
    port = free_port()
    with ThreadPoolExecutor(2) as machines:
        runs = [
            machines.submit(run_group, launcher(config, rank, port, train), timeout, env=ENV)
            for rank in (0, 1)
        ]
        return [run.result() for run in runs]


def steps_of(output: Path) -> dict[int, dict]:
    """The logged metrics by step (a resumed run's lines replace the killed run's)."""
    lines = (output / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m for m in map(json.loads, lines)}


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "model.safetensors")


def test_the_shipped_configs_are_found_by_name(capsys):
    assert config_names() == ["multi-node-ddp", "multi-node-fsdp2"]
    assert main(["accelerate-config", "multi-node-ddp"]) == 0
    assert capsys.readouterr().out.strip() == str(config_path("multi-node-ddp"))
    assert main(["accelerate-config", "multi-node"]) == 2
    assert "there are: ['multi-node-ddp', 'multi-node-fsdp2']" in capsys.readouterr().err
    # accelerate reads them (unknown keys would fail here); the user's fields are commented
    from accelerate.commands.config.config_args import load_config_from_file

    for name, kind in (("multi-node-ddp", "MULTI_GPU"), ("multi-node-fsdp2", "FSDP")):
        config = load_config_from_file(str(config_path(name)))
        assert config.distributed_type == kind and config.num_machines == 2
        text = config_path(name).read_text()
        for field in ("num_machines", "num_processes", "machine_rank", "main_process_ip"):
            assert any(
                line.startswith(f"{field}:") and "# CHANGE" in line for line in text.splitlines()
            )
    fsdp = load_config_from_file(str(config_path("multi-node-fsdp2"))).fsdp_config
    assert fsdp["fsdp_version"] == 2


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_two_machines_split_each_step_and_resume_exactly(babble, model_folder, tmp_path):
    """Three steps on two simulated machines, then steps 2-3 again from the first checkpoint
    on two fresh launchers: the same weights and metrics. (A run killed mid-step and resumed
    is tests/test_algorithms/test_distributed.py's, on one machine; what a second machine changes is
    where the processes come from, not what a checkpoint holds.)"""
    whole = tmp_path / "whole"
    train = train_args(babble, model_folder, whole, "--max-steps", "3")
    began = time.perf_counter()
    first, second = cluster("multi-node-ddp", train)
    seconds = time.perf_counter() - began
    assert first.returncode == second.returncode == 0, first.stderr[-3000:] + second.stderr[-3000:]
    # machine 0 hosts the main process: it reports, and both processes hold the same weights
    assert "trained 3 steps" in first.stdout and "trained" not in second.stdout
    assert "weights agree on 2 processes: yes" in first.stdout
    # each step's 4 rollouts were split: the main process wrote its own 2 samples a step,
    # the metrics count all 4 (gathered from both machines)
    steps = steps_of(whole)
    assert sorted(steps) == [1, 2, 3]
    assert all(sum(m["statuses"].values()) == 4 for m in steps.values())
    assert len((whole / "samples.jsonl").read_text().splitlines()) == 3 * 2
    assert (whole / "checkpoint-1" / "rng-1.pt").exists()  # the second machine's states
    assert any(m["reward_std"] > 0 for m in steps.values())  # the updates had a signal
    start, end = load_file(model_folder / "model.safetensors"), weights(whole / "checkpoint-3")
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert not _ranks_of(whole)  # every process of both machines is gone
    print(f"two simulated machines, 3 GRPO steps: {seconds:.1f} s")

    resumed = tmp_path / "resumed"
    again = train_args(babble, model_folder, resumed, "--max-steps", "3")
    first, second = cluster("multi-node-ddp", [*again, "--resume", str(whole / "checkpoint-1")])
    assert first.returncode == second.returncode == 0, first.stderr[-3000:] + second.stderr[-3000:]
    assert "trained 2 steps" in first.stdout  # steps 2 and 3
    assert "weights agree on 2 processes: yes" in first.stdout
    got = weights(resumed / "checkpoint-3")
    assert all(torch.equal(end[k], got[k]) for k in end)
    assert sorted(steps_of(resumed)) == [2, 3]
    for step, metrics in steps_of(resumed).items():
        assert (metrics["reward"], metrics["loss"]) == (steps[step]["reward"], steps[step]["loss"])


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_the_fsdp2_config_trains_a_sharded_policy_and_resumes_exactly(
    babble, model_folder, tmp_path
):
    """The shipped FSDP2 file on two simulated machines: the policy sharded over both
    processes (`toolgym.algorithms.sharding`), two steps with the transformers engine sampling
    from each process's full replica, checkpoints gathered from both; then step 2 again from
    the first checkpoint on two fresh launchers: the same weights bit for bit."""
    whole = tmp_path / "whole"
    train = train_args(babble, model_folder, whole, "--max-steps", "2")
    first, second = cluster("multi-node-fsdp2", train)
    assert first.returncode == second.returncode == 0, first.stderr[-3000:] + second.stderr[-3000:]
    assert "trained 2 steps" in first.stdout
    assert "weights sharded over 2 processes (FSDP2): one copy" in first.stdout
    steps = steps_of(whole)
    assert sorted(steps) == [1, 2]
    assert all(sum(m["statuses"].values()) == 4 for m in steps.values())
    start, end = load_file(model_folder / "model.safetensors"), weights(whole / "checkpoint-2")
    assert start.keys() == end.keys()  # full tensors, under the model's own names
    assert all(start[k].shape == end[k].shape for k in start)
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert not _ranks_of(whole)

    resumed = tmp_path / "resumed"
    again = train_args(babble, model_folder, resumed, "--max-steps", "2")
    first, second = cluster("multi-node-fsdp2", [*again, "--resume", str(whole / "checkpoint-1")])
    assert first.returncode == second.returncode == 0, first.stderr[-3000:] + second.stderr[-3000:]
    assert "trained 1 steps" in first.stdout or "trained 1 step" in first.stdout
    got = weights(resumed / "checkpoint-2")
    assert all(torch.equal(end[k], got[k]) for k in end)
    assert steps_of(resumed)[2]["loss"] == steps[2]["loss"]
    assert not _ranks_of(resumed)


def test_processes_that_disagree_are_reported(model_folder):
    """The end-of-run check compares every parameter tensor of every process."""
    from transformers import AutoModelForCausalLM

    from toolgym.cli.multinode import compare_fingerprints, weights_fingerprint

    model = AutoModelForCausalLM.from_pretrained(model_folder)
    same = weights_fingerprint(model)
    assert len(same) == len(list(model.parameters()))
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-3  # one weight of one tensor
    moved = weights_fingerprint(model)
    assert moved[0] != same[0] and moved[1:] == same[1:]
    agreed, line = compare_fingerprints([same, same])
    assert agreed and line.startswith("weights agree on 2 processes: yes (fingerprint ")
    agreed, line = compare_fingerprints([same, same, moved])
    assert not agreed
    assert line == (
        "weights agree on 3 processes: no (they differ from process 0's: "
        f"process 2 in 1 of {len(same)} tensors)"
    )
