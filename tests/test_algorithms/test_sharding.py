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
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.batch import collate, idle_batch, training_samples
from toolgym.algorithms.checkpoint import load_checkpoint, save_checkpoint
from toolgym.algorithms.sharding import (
    ShardingError,
    check_fsdp_config,
    check_fsdp_launch,
    full_optimizer_state,
    load_full_optimizer_state,
)
from toolgym.cli import main
from toolgym.testing import tiny_model, tiny_tokenizer

SCRIPT = Path(__file__).parents[1] / "scripts" / "split_update.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ACCELERATE = [str(Path(sys.executable).with_name("accelerate")), "launch", "--num_processes"]
COMMON = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model the update script loads (`from_pretrained`, after the Accelerator)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer, seed=4).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _run(output: Path, model: Path, *launch: str, options: tuple[str, ...] = ()) -> list[dict]:
    output.mkdir()
    command = [*(launch or [sys.executable]), str(SCRIPT), str(output), str(model), *options]
    done = run_group(command, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not _ranks_of(output)
    return [json.loads(path.read_text()) for path in sorted(output.glob("rank*.json"))]


FSDP2 = [*ACCELERATE, "2", "--use_fsdp", "--fsdp_version", "2", *COMMON]


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")
def test_an_uneven_split_under_ddp_and_fsdp2_takes_the_one_process_step(model_folder, tmp_path):
    """A warm-up, then process 0 holds three samples and process 1 one (micro-batches of one:
    three passes against one, evened out by idle passes); two passes, the KL, step rewards
    and clipping that is active. The weights after the step equal one process's (float64; the
    reductions' order differs), as does the gradient norm: the processes' averaged gradients
    are scaled back to the whole step's (they were half of it before). The FSDP2 launch is
    accelerate's command-line default, whose RAM-efficient loading gives process 1 zeros
    (the main process's weights are broadcast before sharding). Under FSDP2 a checkpoint
    saved between two updates loads back into the slices exactly, optimizer state
    included."""
    (alone,) = _run(tmp_path / "one", model_folder)
    ddp = _run(tmp_path / "ddp", model_folder, *ACCELERATE, "2", "--multi_gpu", *COMMON)
    fsdp = _run(tmp_path / "fsdp", model_folder, *FSDP2)
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


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")
def test_compiled_layers_under_fsdp2_take_the_same_step(model_folder, tmp_path):
    """`compile_model` finds the sharded decoder layers (FSDP2 renames their classes) and
    compiles them inside the update; the step matches one eager process's to float64
    rounding amplified by AdamW (compiled kernels reduce in another order)."""
    (alone,) = _run(tmp_path / "one", model_folder)
    fsdp = _run(tmp_path / "fsdp", model_folder, *FSDP2, options=("--compile-model",))
    for record in fsdp:
        assert record["sharded"] and record["decoder_layers"] == 2
        assert record["first"] == pytest.approx(alone["first"], rel=1e-4, abs=1e-4)
        assert record["again"] == record["second"]


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


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("FSDP_SHARDING_STRATEGY", "HYBRID_SHARD", "fsdp_sharding_strategy 'HYBRID_SHARD'"),
        ("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT", "fsdp_state_dict_type"),
        ("ACCELERATE_MIXED_PRECISION", "bf16", "use toolgym's --bf16"),
    ],
)
def test_fsdp_settings_toolgym_would_ignore_are_refused(monkeypatch, variable, value, reason):
    """Settings accelerate would apply through `prepare`, which a sharded policy skips."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ShardingError, match=reason):
        check_fsdp_launch()


def test_lora_under_fsdp_is_refused():
    with pytest.raises(ShardingError, match="LoRA adapters are not trained under FSDP"):
        check_fsdp_config(GRPOConfig(output_dir="unused", lora={"r": 4}))
    check_fsdp_config(GRPOConfig(output_dir="unused"))


def test_an_optimizer_saved_before_its_first_step_stays_empty():
    """torch's full optimizer state dict would take a step at learning rate 0 to create the
    state (AdamW's step count 1 with zero moments), so that a run saved and resumed before its
    first update would bias-correct its next step differently from one never stopped."""
    model = tiny_model(tiny_tokenizer(), seed=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = full_optimizer_state(model, optimizer)
    assert not optimizer.state and not saved["state"]
    load_full_optimizer_state(model, optimizer, saved)
    assert not optimizer.state


def test_checkpoints_of_one_kind_do_not_resume_the_other(tmp_path):
    """A sharded run's optimizer state is keyed by parameter name, a plain run's by number:
    resuming one as the other is refused (it would silently drop the moments)."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    by_name = {"state": {"lm_head.weight": {"step": torch.tensor(1.0)}}, "param_groups": []}
    save_checkpoint(tmp_path, model, tokenizer, optimizer, scheduler, 1, optimizer_state=by_name)
    with pytest.raises(ValueError, match="saved by an FSDP run"):
        load_checkpoint(tmp_path, model, optimizer, scheduler)
    by_number = {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": []}
    with pytest.raises(ValueError, match="saved by a run without FSDP"):
        load_full_optimizer_state(model, optimizer, by_number)
