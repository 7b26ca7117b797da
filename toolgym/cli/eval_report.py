"""An evaluation's figures: pass@k and mean@k per row with standard errors, as a JSON report,
and the paired comparison of two reports (`toolgym eval --report`, `--compare`).

A row is one task (a dataset row, reset with the same seed every time); it is played
`rollouts` times. Per row: the rewards, the successes `c` of the `n` rollouts, pass@k (the
chance that at least one of k rollouts drawn without replacement succeeds: the unbiased
estimator 1 - C(n-c, k) / C(n, k) of Chen et al. 2021) and mean@k (the mean reward of the
rollouts). The report's figures are means over rows with their standard errors (the
standard deviation over rows / sqrt(rows)); `compare_reports` pairs two reports row by row
(same rows, same order) and gives each figure's mean paired difference and its standard
error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from toolgym.agents.trajectory import Trajectory, summarize

REPORT_VERSION = 1


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of `k` of `n` rollouts (`c` of them successes), drawn
    without replacement, succeeds."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(n: int) -> list[int]:
    """The k reported for `n` rollouts: 1, 2, 4, ... and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def mean_and_se(values: Sequence[float]) -> dict[str, float]:
    """`{"mean": ..., "se": ...}` over `values` (se 0.0 for a single value)."""
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return {"mean": mean, "se": se}


def eval_report(
    episodes: Sequence[Sequence[Trajectory]],
    settings: dict[str, Any],
    success_threshold: float = 1.0,
) -> dict[str, Any]:
    """The report of an evaluation: `episodes[i]` are row i's rollouts (each row the same
    number); `settings` (the environment, model, engine, temperature, seed ...) is kept as
    it is, so that a comparison can say what differs."""
    if not episodes or any(len(row) != len(episodes[0]) for row in episodes) or not episodes[0]:
        raise ValueError("every row needs the same number (at least 1) of rollouts")
    n = len(episodes[0])
    per_row: list[dict[str, Any]] = []
    for index, rollouts in enumerate(episodes):
        rewards = [t.reward or 0.0 for t in rollouts]  # no reward counts 0, as in training
        successes = sum(r >= success_threshold for r in rewards)
        per_row.append(
            {
                "row": index,
                "rewards": rewards,
                "statuses": [t.status for t in rollouts],
                "successes": successes,
                "mean_reward": statistics.fmean(rewards),
                "pass_at_k": {str(k): pass_at_k(n, successes, k) for k in k_values(n)},
            }
        )
    return {
        "version": REPORT_VERSION,
        "settings": dict(settings),
        "rows": len(per_row),
        "rollouts": n,
        "success_threshold": success_threshold,
        "pass_at_k": {
            str(k): mean_and_se([r["pass_at_k"][str(k)] for r in per_row]) for k in k_values(n)
        },
        "mean_at_k": mean_and_se([r["mean_reward"] for r in per_row]),
        "summary": summarize([t for row in episodes for t in row], success_threshold),
        "per_row": per_row,
    }


def compare_reports(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` against `base`, row by row: for mean@k and each pass@k both reports have, the
    two means and the mean paired difference (new - base) with its standard error; and the
    settings that differ. Raises ValueError for reports of different rows (their count, or
    the rows' rewards lists missing)."""
    for report in (base, new):
        if report.get("version") != REPORT_VERSION or "per_row" not in report:
            raise ValueError("not a toolgym eval report (toolgym eval --report FILE.json)")
    if base["rows"] != new["rows"]:
        raise ValueError(
            f"the reports have {base['rows']} and {new['rows']} rows: a paired comparison "
            "needs the same rows (the same dataset, -n and seed)"
        )
    figures: dict[str, dict[str, float]] = {
        "mean_at_k": _paired(base, new, lambda row: row["mean_reward"])
    }
    for k in base["pass_at_k"]:
        if k in new["pass_at_k"]:
            figures[f"pass@{k}"] = _paired(base, new, lambda row, k=k: row["pass_at_k"][k])
    settings = sorted(
        key
        for key in {*base["settings"], *new["settings"]}
        if base["settings"].get(key) != new["settings"].get(key)
    )
    return {"rows": base["rows"], "figures": figures, "settings_that_differ": settings}


def _paired(base: dict[str, Any], new: dict[str, Any], read: Any) -> dict[str, float]:
    before = [float(read(row)) for row in base["per_row"]]
    after = [float(read(row)) for row in new["per_row"]]
    change = mean_and_se([b - a for a, b in zip(before, after, strict=True)])
    return {
        "base": statistics.fmean(before),
        "new": statistics.fmean(after),
        "change": change["mean"],
        "se": change["se"],
    }


def format_report(report: dict[str, Any]) -> str:
    """The report's headline figures, one line each."""
    lines = [f"{report['rows']} rows x {report['rollouts']} rollouts"]
    mean = report["mean_at_k"]
    lines.append(f"  mean@{report['rollouts']} reward {mean['mean']:.3f} ± {mean['se']:.3f}")
    for k, figure in report["pass_at_k"].items():
        lines.append(f"  pass@{k} {figure['mean']:.3f} ± {figure['se']:.3f}")
    return "\n".join(lines)


def format_comparison(comparison: dict[str, Any]) -> str:
    """The comparison, one line per figure: base -> new (change ± se)."""
    lines = [f"paired over {comparison['rows']} rows (new - base):"]
    for name, figure in comparison["figures"].items():
        lines.append(
            f"  {name}: {figure['base']:.3f} -> {figure['new']:.3f} "
            f"({figure['change']:+.3f} ± {figure['se']:.3f})"
        )
    if comparison["settings_that_differ"]:
        lines.append(f"  settings that differ: {', '.join(comparison['settings_that_differ'])}")
    return "\n".join(lines)
