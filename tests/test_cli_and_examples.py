"""The `toolgym` command and the Wordle example run as a user would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from toolgym.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_toolgym_envs_lists_builtins_with_tools(capsys):
    assert main(["envs", "--tools"]) == 0
    out = capsys.readouterr().out
    assert "Wordle-v0" in out and "Arithmetic-v0" in out and "GuessNumber-v0" in out
    assert "guess: Guess the secret word" in out


def test_wordle_example_plays_held_out_games():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "wordle.py"), "--games", "10"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "guess('" in done.stdout
    win_rate = float(done.stdout.split("win rate ")[1].split("%")[0])
    assert win_rate >= 90.0
