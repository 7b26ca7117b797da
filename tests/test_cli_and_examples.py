"""The `toolgym` command and the Wordle example run as a user would run them."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolgym.agents.trajectory import load_jsonl
from toolgym.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_toolgym_envs_lists_builtins_with_tools(capsys):
    assert main(["envs", "--tools"]) == 0
    out = capsys.readouterr().out
    assert "Wordle-v0" in out and "Arithmetic-v0" in out and "GuessNumber-v0" in out
    assert "guess: Guess the secret word" in out


def test_wordle_example_expert_wins_held_out_games():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "wordle.py"), "--expert", "--eval-games", "10"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    win_rate = float(done.stdout.split("win rate ")[1].split("%")[0])
    assert win_rate >= 90.0


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.timeout(900)  # about 3 minutes alone on 2 cores; more when the CPU is shared
def test_wordle_example_quick_training_run(tmp_path):
    """`python examples/wordle.py --quick`: warm-up, evaluations, GRPO steps, the plot."""
    command = [sys.executable, str(ROOT / "examples" / "wordle.py"), "--quick"]
    environment = {**os.environ, "TOOLGYM_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [*command, "--output-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=900,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "run"
    assert "before GRPO" in done.stdout and "after GRPO" in done.stdout
    assert "warm-up on 8 expert games" in done.stdout and ", trained:" in done.stdout
    for line in ("sampled before", "sampled after", "sampled change"):
        assert line in done.stdout  # the summary table
    assert "greedy" not in done.stdout  # sampled games only, by default
    assert "whole run" in done.stdout and "warm-up" in done.stdout  # the stage table
    assert (out / "rewards.png").stat().st_size > 1000
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert all(0 <= m["env/valid_guesses"] <= 6 and "env/win" in m for m in metrics)
    assert "consistent" in done.stdout and "yellows" in done.stdout  # the skills, per game
    terminal = done.stdout + done.stderr
    # engine logs go to the run folder; the terminal keeps stages, progress and results
    assert "set_num_threads" not in terminal and "Loading weights" not in terminal
    if importlib.util.find_spec("vllm"):  # the example's engine when installed
        assert "set_num_threads" in (out / "engine.log").read_text()
    stages = json.loads((out / "stages.json").read_text())["stages"]
    assert stages["evaluation"]["calls"] == 2 and stages["update"]["calls"] == 2
    assert all(stage["peak_bytes"] > 0 for stage in stages.values())
    assert len(list((tmp_path / "cache" / "warmup").iterdir())) == 1  # kept for the next run


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.timeout(900)
def test_repl_example_quick_training_run(tmp_path):
    """`python examples/repl.py --quick`: SmolLM2 writes Python line by line in a process
    sandbox (inline protocol) through warm-up, evaluations and GRPO steps."""
    command = [sys.executable, str(ROOT / "examples" / "repl.py"), "--quick"]
    environment = {**os.environ, "TOOLGYM_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [*command, "--output-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=900,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warm-up on 8 solutions, trained" in done.stdout
    for line in ("greedy before", "sampled after", "greedy change", "lines that raise"):
        assert line in done.stdout
    out = tmp_path / "run"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(math.isfinite(m["loss"]) for m in metrics)
    episodes = [
        episode
        for stage in ("before", "after")
        for mode in ("greedy", "sampled")
        for episode in load_jsonl(out / f"eval-{stage}-{mode}.jsonl")
    ]
    assert all(len(e.step_rewards) == e.metrics["tool_calls"] for e in episodes)  # one per line
    assert any(0 in e.loss_mask for e in episodes)  # some line printed or raised: output inline


def test_eval_and_play_with_a_model_folder(tmp_path, capsys):
    import json

    from toolgym.testing import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    common = ["--model", str(tmp_path), "--max-new-tokens", "8", "--max-turns", "2"]
    for sandbox in ("local", "process"):
        assert (
            main(["eval", "GuessNumber-v0", *common, "-n", "3", "--json", "--sandbox", sandbox])
            == 0
        )
        summary = json.loads(_last_json(capsys))
        assert summary["episodes"] == 3
        assert sum(summary["statuses"].values()) == 3 and "env_error" not in summary["statuses"]
    assert main(["play", "GuessNumber-v0", *common]) == 0
    out = capsys.readouterr().out
    headers = re.findall(r"^(user|assistant|tool \w+)\b", out, flags=re.MULTILINE)
    assert headers[:2] == ["user", "assistant"] and "=== status" in out
    assert "\x1b[" not in out  # captured output is no terminal: plain text


def _last_json(capsys) -> str:
    out = capsys.readouterr().out
    return out[out.index("{") :]


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_eval_the_embedded_smollm2_on_wordle(capsys):
    """The issue's command: `toolgym eval Wordle-v0 --model smollm2-135m -n 8` on the CPU."""
    assert (
        main(
            [
                "eval",
                "Wordle-v0",
                "--model",
                "smollm2-135m",
                "-n",
                "8",
                "--json",
                "--max-new-tokens",
                "64",
            ]
        )
        == 0
    )
    import json

    summary = json.loads(_last_json(capsys))
    assert summary["episodes"] == 8
    assert set(summary["statuses"]) <= {"finished", "env_done", "max_turns", "length"}
    assert set(summary["env"]) >= {"valid_guesses", "consistent_guesses", "win"}  # the skills
