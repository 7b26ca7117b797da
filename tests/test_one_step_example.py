"""`python examples/one_step.py --tiny`: the one-step reference page runs as a reader runs it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from helpers import run_group

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_one_grpo_step_runs_top_to_bottom(tmp_path):
    command = [sys.executable, str(ROOT / "examples" / "one_step.py"), "--tiny"]
    environment = {**os.environ, "TOOLGYM_CACHE": str(tmp_path / "cache")}
    done = run_group(command, 280, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = re.search(r"episodes (\d+): \{(.+)\}", done.stdout)
    assert episodes and int(episodes.group(1)) == 8, done.stdout
    advantages = re.search(r"advantages \[(.+)\]", done.stdout)
    assert advantages and len(advantages.group(1).split(",")) == 8
    figures = re.search(r"sampled tokens (\d+) of (\d+) in the batch; loss (\S+);", done.stdout)
    assert figures, done.stdout
    sampled, total, loss = int(figures.group(1)), int(figures.group(2)), float(figures.group(3))
    assert 0 < sampled < total  # the prompts and tool results are in the batch, not the loss
    assert loss == loss  # finite (not NaN)
