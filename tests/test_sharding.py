"""One update split over processes: DDP and FSDP2 (`toolgym.algorithms.sharding`) take the
same step as one process, however unevenly the samples are split, and a sharded checkpoint
loads back exactly. Two CPU processes under `accelerate launch` (gloo)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_group
from test_distributed import _ranks_of

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.algorithms.batch import collate, idle_batch, training_samples
from toolgym.algorithms.sharding import ShardingError, check_fsdp_launch
from toolgym.cli import main

SCRIPT = Path(__file__).parent / "scripts" / "split_update.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ACCELERATE = [str(Path(sys.executable).with_name("accelerate")), "launch", "--num_processes"]
COMMON = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def _run(output: Path, *launch: str) -> list[dict]:
    output.mkdir()
    command = [*(launch or [sys.executable]), str(SCRIPT), str(output)]
    done = run_group(command, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not _ranks_of(output)
    return [json.loads(path.read_text()) for path in sorted(output.glob("rank*.json"))]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")
def test_an_uneven_split_under_ddp_and_fsdp2_takes_the_one_process_step(tmp_path):
    """Process 0 holds three samples and process 1 one (micro-batches of one: three passes
    against one, evened out by idle passes); two passes, the KL, step rewards and clipping
    that is active. The weights after the step equal one process's (float64; the reductions'
    order differs), as does the gradient norm: the processes' averaged gradients are scaled
    back to the whole step's (they were half of it before). Under FSDP2 a checkpoint saved
    between two updates loads back into the slices exactly, optimizer state included."""
    (alone,) = _run(tmp_path / "one")
    ddp = _run(tmp_path / "ddp", *ACCELERATE, "2", "--multi_gpu", *COMMON)
    fsdp = _run(tmp_path / "fsdp", *ACCELERATE, "2", "--use_fsdp", "--fsdp_version", "2", *COMMON)
    assert alone["processes"] == 1 and not alone["sharded"]
    assert [r["sharded"] for r in ddp] == [False, False]
    assert [r["sharded"] for r in fsdp] == [True, True]
    for record in [*ddp, *fsdp]:
        assert record["processes"] == 2
        assert record["first"] == pytest.approx(alone["first"], rel=1e-12, abs=1e-12)
        assert record["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-12)
        assert record["reloaded"] == record["first"]  # the checkpoint, back in place
        assert record["again"] == record["second"]  # optimizer state and schedule too
    assert alone["second"] != alone["first"]  # the second update moved the weights


def test_idle_batches_train_on_nothing():
    """The pass a process adds to keep step with a busier one has no token in the loss; a
    process with no samples at all passes two padding tokens."""
    empty = idle_batch([], pad_id=7, device=torch.device("cpu"))
    assert empty.input_ids.tolist() == [[7, 7]] and empty.loss_mask.sum() == 0
    sample = Sample([1, 2, 3])
    sample.append([4, 5], sampled=True, logprobs=[-1.0, -1.0])
    real = collate(training_samples([Trajectory([sample])], [0.5]), pad_id=0)
    idle = idle_batch([real], pad_id=0, device=torch.device("cpu"))
    assert torch.equal(idle.input_ids, real.input_ids) and real.loss_mask.sum() == 2
    assert idle.loss_mask.sum() == 0 and idle.token_advantages.abs().sum() == 0


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        ({"FSDP_VERSION": "1"}, "toolgym shards with FSDP2 only"),
        ({"FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"}, "parameter offload"),
        ({"FSDP_VERSION": "2", "FSDP_ACTIVATION_CHECKPOINTING": "true"}, "--gradient-check"),
    ],
)
def test_fsdp_settings_toolgym_does_not_honour_are_refused(monkeypatch, capsys, variables, reason):
    """At the start of `toolgym train`, before anything loads, with the reason."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ShardingError, match=reason):
        check_fsdp_launch()
    assert main(["train", "Wordle-v0", "--model", "no-such-model"]) == 2
    assert reason in capsys.readouterr().err


def test_a_launch_without_fsdp_is_not_checked(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    monkeypatch.setenv("FSDP_VERSION", "1")
    check_fsdp_launch()
