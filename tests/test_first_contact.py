"""A newcomer's first hour (issue 42 item 7): the frictions a new user met, each gone."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from toolgym.cli import main

ROOT = Path(__file__).resolve().parent.parent
TOOLGYM = [sys.executable, "-m", "toolgym"]


def test_a_closed_pipe_ends_the_listing_quietly():
    """`toolgym envs --tools | head -1` once ended in a BrokenPipeError traceback. The reader
    here leaves before the listing writes anything, so every write meets the closed pipe."""
    listing = subprocess.Popen(
        [*TOOLGYM, "envs", "--tools"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert listing.stdout is not None and listing.stderr is not None
    listing.stdout.close()  # the reader leaves, as `head` does after its lines
    error = listing.stderr.read().decode()
    assert listing.wait(timeout=60) in (0, 1)
    assert "Traceback" not in error and "BrokenPipeError" not in error, error


def test_ids_a_file_registers_are_usable_by_name(tmp_path, capsys):
    module = tmp_path / "my_envs.py"
    module.write_text(
        textwrap.dedent(
            '''
            import toolgym


            class Echo(toolgym.Environment):
                """Say something back."""

                def reset(self, **row):
                    return "Say something."

                def echo(self, text: str) -> str:
                    """Echo the text.

                    Args:
                        text: What to echo.
                    """
                    return text


            toolgym.register("mine/Echo-v0", Echo)
            '''
        )
    )
    assert main(["eval", "mine/Echo-v0", "--model", "x"]) == 2  # unknown without --import
    assert "toolgym --import path/to/file.py" in capsys.readouterr().err
    assert main(["--import", str(module), "envs", "--tools"]) == 0
    out = capsys.readouterr().out
    assert "mine/Echo-v0" in out and "echo: Echo the text." in out


def test_a_tracker_without_its_package_names_the_extra(tmp_path):
    """Refused when training starts, before the model loads (a config naming a tracker can be
    written anywhere); it once ended in a raw ModuleNotFoundError after the model loaded."""
    from toolgym.algorithms import GRPOConfig, GRPOTrainer

    def start(tracker: str) -> None:
        args = GRPOConfig(output_dir=str(tmp_path), report_to=[tracker])
        GRPOTrainer("no-such-model-is-loaded", "Wordle-v0", [{"prompt": "go"}], args=args)

    with pytest.raises(ValueError, match="unknown tracker 'mlflow'"):
        start("mlflow")
    missing = [name for name in ("wandb", "trackio") if importlib.util.find_spec(name) is None]
    if not missing:
        pytest.skip("wandb and trackio are both installed")
    with pytest.raises(ValueError, match=rf'pip install "toolgym\[{missing[0]}\]"'):
        start(missing[0])


def test_the_declared_python_is_the_one_tested():
    """pyproject's requires-python is what CI runs (3.11, the interpreter of this suite) and
    what the code needs (`asyncio.timeout`, `tomllib`: 3.11)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"
    assert project["tool"]["mypy"]["python_version"] == "3.11"
    assert sys.version_info[:2] >= (3, 11)
