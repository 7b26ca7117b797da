"""`python examples/harness.py --quick` as a user runs it: GRPO where every episode is an
OpenAI-client agent loop against the endpoint, on the tiny tool caller."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from helpers import run_group

from toolgym.agents.trajectory import load_jsonl

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.timeout(300)
def test_harness_example_quick_training_run(tmp_path):
    command = [sys.executable, str(ROOT / "examples" / "harness.py"), "--quick"]
    environment = {**os.environ, "TOOLGYM_CACHE": str(tmp_path / "cache")}
    done = run_group([*command, "--output-dir", str(tmp_path / "run")], 280, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "run"
    assert "the tiny tool caller, fitted to one expert game" in done.stdout
    for line in ("before GRPO (greedy)", "after GRPO (sampled)", "greedy change", "whole run"):
        assert line in done.stdout
    assert "every episode an openai-client loop" in done.stdout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in metrics)
    figures = json.loads((out / "evaluation.json").read_text())
    assert figures["before"]["greedy"]["episodes"] == figures["after"]["greedy"]["episodes"] == 4
    for name in ("eval-before-greedy.jsonl", "eval-after-sampled.jsonl", "samples.jsonl"):
        for episode in load_jsonl(out / name):
            assert episode.status not in ("env_error", "engine_error"), episode.error
            assert episode.metrics["turns"] >= 1 and episode.model_tokens > 0
            # the client sends each conversation back as it got it: one joined sequence
            assert len(episode.samples) == 1
