"""The bench scripts keep running as the code under them changes (their figures are not
asserted: speed is measured by the scripts, never by tests)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.slow
def test_train_step_bench_measures_one_toolgym_update(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import train_step

    args = argparse.Namespace(
        arm="toolgym",
        preset="small",
        dtype="float32",
        device="cpu",
        batch=2,
        prompt=16,
        completion=64,
        repeats=1,
        chunk=32,
        loss_impl="auto",
        compile_model="off",
        shared_prompt=True,  # one GRPO group: the update shares the prompt on this CPU
        no_share_prefix=False,
    )
    result = train_step.measure(args)
    assert result["seconds"] > 0 and math.isfinite(result["tokens_per_s"])
    assert result["peak_mib"] > 0
    sys.modules.pop("train_step", None)
