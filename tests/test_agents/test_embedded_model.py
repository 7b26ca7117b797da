"""The embedded model's cache is correct under any concurrency (issue 42 item 1): threads,
plain processes and accelerate ranks converting at once from an empty cache leave one complete
folder and all load it; a broken or partial folder is found and rebuilt with a message."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from toolgym.agents import embedded_model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "load_embedded_model.py"
CONVERTING = re.compile(r"toolgym: converting smollm2-135m")

pytestmark = pytest.mark.slow


def _only_the_folder_is_left(cache: Path) -> None:
    names = sorted(path.name for path in cache.iterdir())
    assert names == [f".{embedded_model.FOLDER}.lock", embedded_model.FOLDER], names
    assert embedded_model.problem(cache / embedded_model.FOLDER) is None


@pytest.fixture(scope="module")
def converted_by_threads(tmp_path_factory):
    """Four threads of one process convert into an empty cache at once."""
    cache = tmp_path_factory.mktemp("threads") / "cache"
    results: list[Path | BaseException] = []

    def convert() -> None:
        try:
            results.append(embedded_model.converted(cache))
        except BaseException as error:
            results.append(error)

    threads = [threading.Thread(target=convert) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return cache, results


def test_threads_converting_at_once_leave_one_complete_folder(converted_by_threads):
    cache, results = converted_by_threads
    assert results == [cache / embedded_model.FOLDER] * 4
    _only_the_folder_is_left(cache)
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(cache / embedded_model.FOLDER).model_type == "llama"


def _loaded_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("loaded ")]


@pytest.mark.timeout(900)
def test_processes_converting_at_once_convert_once_and_all_load_it(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "TOOLGYM_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=800) for process in processes]
    assert all(process.returncode == 0 for process in processes), [e[-2000:] for _, e in outputs]
    lines = [_loaded_lines(out) for out, _ in outputs]
    assert all(len(found) == 1 for found in lines) and len({found[0] for found in lines}) == 1
    assert lines[0][0].startswith("loaded llama ")
    assert sum(len(CONVERTING.findall(err)) for _, err in outputs) == 1  # one conversion
    _only_the_folder_is_left(cache)


@pytest.mark.timeout(900)
def test_accelerate_ranks_converting_at_once_write_the_whole_folder(tmp_path):
    """Under `torch.distributed`, `save_pretrained` writes weights only on rank 0: a rank that
    converted in-process once left a folder of tokenizer files only, which every later load
    failed on (`Unrecognized model ... model_type`)."""
    from helpers import run_group

    cache = tmp_path / "cache"
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--num_processes", "2", "--multi_gpu"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += [str(SCRIPT), "--accelerate"]
    env = {**os.environ, "TOOLGYM_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    done = run_group(command, timeout=800, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = _loaded_lines(done.stdout)
    assert len(lines) == 2 and lines[0] == lines[1], done.stdout
    assert len(CONVERTING.findall(done.stderr)) == 1
    _only_the_folder_is_left(cache)


def test_a_partial_folder_is_rebuilt_with_a_message(converted_by_threads, tmp_path, capfd):
    """The folder the accelerate ranks once left (tokenizer files only) is rebuilt, once."""
    source, _ = converted_by_threads
    cache = tmp_path / "cache"
    target = cache / embedded_model.FOLDER
    target.mkdir(parents=True)
    (cache / f".{embedded_model.FOLDER}-converting-dead").mkdir()  # a killed conversion's
    for name in ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json"):
        if (source / embedded_model.FOLDER / name).exists():
            shutil.copy(source / embedded_model.FOLDER / name, target / name)
    assert embedded_model.problem(target).startswith("no manifest")
    assert embedded_model.converted(cache) == target
    err = capfd.readouterr().err
    assert f"toolgym: {target} is incomplete (no manifest" in err
    assert "converting smollm2-135m again" in err
    _only_the_folder_is_left(cache)
    assert embedded_model.converted(cache) == target  # verified, not converted again
    assert "converting" not in capfd.readouterr().err


def test_damage_to_a_converted_folder_is_found(converted_by_threads, tmp_path):
    source, _ = converted_by_threads
    folder = tmp_path / "copy"
    shutil.copytree(source / embedded_model.FOLDER, folder)
    assert embedded_model.problem(folder) is None
    weights = next(folder.glob("*.safetensors"))
    full = weights.stat().st_size
    with weights.open("r+b") as handle:
        handle.truncate(full // 2)
    expected = f"{weights.name} has {full // 2} bytes, the manifest says {full}"
    assert embedded_model.problem(folder) == expected
    (folder / "config.json").unlink()  # listed before the weights: found first
    assert embedded_model.problem(folder) == "config.json is missing"
    (folder / embedded_model.MANIFEST).write_text("{")
    assert str(embedded_model.problem(folder)).startswith("unreadable manifest")
    assert embedded_model.problem(tmp_path / "nothing") == "not converted yet"
