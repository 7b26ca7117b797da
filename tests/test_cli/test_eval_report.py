"""`toolgym eval`'s figures: pass@k against counting every subset, mean@k and paired
comparisons against hand-computed values."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.cli.eval_report import (
    compare_reports,
    eval_report,
    format_comparison,
    k_values,
    pass_at_k,
)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(n):
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(3, 1, 4)


def test_k_values_are_powers_of_two_and_n():
    assert k_values(1) == [1] and k_values(4) == [1, 2, 4] and k_values(6) == [1, 2, 4, 6]


def episode(reward: float | None, status: str = "finished") -> Trajectory:
    metrics = {"turns": 1.0, "tool_calls": 0.0, "tool_failures": 0.0}
    return Trajectory([Sample([1])], reward=reward, status=status, metrics=metrics)  # type: ignore[arg-type]


def test_the_report_holds_per_row_figures_and_their_standard_errors():
    rows = [
        [episode(1.0), episode(0.0), episode(0.5)],
        [episode(0.0), episode(None), episode(0.0)],  # no reward counts 0
        [episode(1.0), episode(1.0), episode(0.0, "length")],
    ]
    report = eval_report(rows, {"model": "m"}, success_threshold=1.0)
    assert (report["rows"], report["rollouts"]) == (3, 3)
    assert [r["successes"] for r in report["per_row"]] == [1, 0, 2]
    means = [0.5, 0.0, 2 / 3]
    assert [r["mean_reward"] for r in report["per_row"]] == pytest.approx(means)
    assert report["mean_at_k"]["mean"] == pytest.approx(statistics.fmean(means))
    assert report["mean_at_k"]["se"] == pytest.approx(statistics.stdev(means) / math.sqrt(3))
    pass1 = [1 / 3, 0.0, 2 / 3]
    assert report["pass_at_k"]["1"]["mean"] == pytest.approx(statistics.fmean(pass1))
    assert report["pass_at_k"]["3"]["mean"] == pytest.approx(2 / 3)  # rows with any success
    assert report["summary"]["episodes"] == 9
    assert report["per_row"][2]["statuses"] == ["finished", "finished", "length"]
    with pytest.raises(ValueError, match="same number"):
        eval_report([[episode(1.0)], []], {})


def test_two_reports_are_compared_row_by_row():
    base = eval_report([[episode(0.0), episode(1.0)], [episode(0.0), episode(0.0)]], {"m": 1})
    new = eval_report([[episode(1.0), episode(1.0)], [episode(1.0), episode(0.0)]], {"m": 2})
    comparison = compare_reports(base, new)
    mean = comparison["figures"]["mean_at_k"]
    # per row: 0.5 -> 1.0 and 0.0 -> 0.5, so the changes are 0.5 and 0.5 (se 0)
    assert (mean["base"], mean["new"], mean["change"], mean["se"]) == (0.25, 0.75, 0.5, 0.0)
    pass1 = comparison["figures"]["pass@1"]
    assert pass1["change"] == pytest.approx(0.5) and pass1["se"] == 0.0
    assert comparison["figures"]["pass@2"]["change"] == pytest.approx(0.5)
    assert comparison["settings_that_differ"] == ["m"]
    assert "mean_at_k: 0.250 -> 0.750 (+0.500 ± 0.000)" in format_comparison(comparison)
    three = eval_report([[episode(0.0)]] * 3, {})
    with pytest.raises(ValueError, match="2 and 3 rows"):
        compare_reports(base, three)
    with pytest.raises(ValueError, match="not a toolgym eval report"):
        compare_reports(base, {"rows": 2})
