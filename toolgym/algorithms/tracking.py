"""Training logs: metrics as JSONL (always), optional trackers, and the reward plot."""

from __future__ import annotations

import json
import math
import statistics
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolgym.agents.trajectory import summarize

if TYPE_CHECKING:
    import torch

    from toolgym.algorithms.config import GRPOConfig


def step_metrics(
    everyone: list[tuple[float, bool]],
    outcomes: list[dict[str, Any]],
    sources: dict[str, list[float]],
    used: torch.Tensor,
    args: GRPOConfig,
    logged: list[dict[str, list[float]]] | None = None,
) -> dict[str, Any]:
    """A training step's logged figures: reward, success rate, turns, calls, statuses, the
    reward's sources and the environment's metrics, from every process's episodes
    (`everyone`: (reward, valid) per episode; `outcomes`: `trajectory.outcome` per episode),
    and the mean of each value reward functions logged with `log_metric` (`logged`: per process)."""
    rewards = [r for r, _ in everyone]
    summary = summarize(outcomes, args.success_threshold)
    metrics: dict[str, Any] = {
        "reward": summary["reward"],
        "reward_std": statistics.pstdev(rewards),
        "success_rate": summary["success_rate"],
        "excluded": sum(not v for _, v in everyone),
        "groups_without_signal": groups_without_signal(rewards, used, args.num_generations),
        **{k: summary[k] for k in ("turns", "tool_calls", "tool_failures", "statuses")},
    }
    for name, values in sources.items():
        finite = [v for v in values if not math.isnan(v)]
        if finite and len(sources) > 1:
            metrics[f"rewards/{name}"] = statistics.fmean(finite)
    metrics.update({f"env/{name}": value for name, value in summary["env"].items()})
    metrics.update({k: v for k, v in summary.items() if k.startswith("envs/")})
    metrics.update(reward_log_means(logged or []))
    return metrics


def merged_sources(per_process: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Every process's reward sources (name: one value per episode), joined in process
    order, so that `rewards/<source>` is the mean over all of a step's episodes."""
    merged: dict[str, list[float]] = {}
    for sources in per_process:
        for name, values in sources.items():
            merged.setdefault(name, []).extend(values)
    return merged


def reward_log_means(per_process: list[dict[str, list[float]]]) -> dict[str, float]:
    """The mean of each value reward functions logged with `log_metric(name, value)` over
    every process, by name (as TRL logs them)."""
    merged = merged_sources(per_process)
    return {name: statistics.fmean(values) for name, values in merged.items() if values}


class SignalWatch:
    """Says once per run when a whole step had no signal: in every group all rewards were
    equal, so every advantage was 0 and the update changed nothing."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self.said = False

    def check(self, step: int, metrics: dict[str, Any], main_process: bool = True) -> None:
        """Warn (once, from the main process) if `metrics` is such a step's."""
        groups = sum(metrics["statuses"].values()) // self.group_size
        if self.said or not groups or metrics["groups_without_signal"] < groups:
            return
        self.said = True
        if main_process:
            warnings.warn(
                f"step {step}: no signal: in every group all rewards were equal, so the "
                "advantages are 0 and this step learned nothing (`groups_without_signal` "
                "counts such groups each step). Rewards that vary within a group are needed: "
                "a graded or shaped reward, easier or harder rows, more generations per row",
                stacklevel=2,
            )


def groups_without_signal(rewards: list[float], used: torch.Tensor, size: int) -> int:
    """Groups whose valid members all got the same reward (no gradient from them)."""
    count = 0
    for start in range(0, len(rewards), size):
        members = zip(rewards[start : start + size], used[start : start + size], strict=True)
        values = {r for r, u in members if u}
        count += len(values) <= 1
    return count


class MetricsLog:
    """Appends one JSON object per logged step to `metrics.jsonl` and forwards the metrics to
    the trackers named in `report_to` ("trackio", "wandb", "tensorboard").

    The first entry a run logs drops the file's entries from that step on: a fresh run in a
    used folder starts a new history, and a resumed run replaces the steps it repeats.
    """

    def __init__(self, output_dir: str | Path, report_to: list[str], config: dict[str, Any]):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._trackers = [_tracker(name, Path(output_dir), config) for name in report_to]
        self._trimmed = False

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one step's metrics (and print a line)."""
        if not self._trimmed:
            kept = [entry for entry in self.history() if entry["step"] < step]
            self.path.write_text("".join(json.dumps(entry) + "\n" for entry in kept))
            self._trimmed = True
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps({"step": step, **metrics}) + "\n")
        numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        for tracker in self._trackers:
            tracker(step, numbers)

    def history(self) -> list[dict[str, Any]]:
        """Every logged step's metrics, in order."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def _tracker(name: str, output_dir: Path, config: dict[str, Any]) -> Any:
    if name == "wandb":
        import wandb

        run = wandb.init(dir=str(output_dir), config=config)
        return lambda step, metrics: run.log(metrics, step=step)
    if name == "trackio":
        import trackio

        trackio.init(project="toolgym", config=config)
        return lambda step, metrics: trackio.log(metrics, step=step)
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(output_dir / "tensorboard"))

        def write(step: int, metrics: dict[str, float]) -> None:
            for key, value in metrics.items():
                writer.add_scalar(key, value, step)
            writer.flush()

        return write
    raise ValueError(f"unknown tracker {name!r}; use trackio, wandb or tensorboard")


def plot_rewards(
    history: list[dict[str, Any]],
    path: str | Path,
    held_out: Sequence[dict[str, Any]] = (),
    smoothing: float = 0.8,
) -> Path:
    """Reward (its own scale: shaped rewards can be small or negative) and success rate (0 to 1)
    over steps, in two panels of one PNG: each step's value faint, an exponential moving
    average (`smoothing`, bias-corrected) over it, the logged `eval/` figures, and `held_out`
    points (dicts with `label`, `step`, `reward`, `success_rate`; points sharing a label are
    joined, e.g. a before and an after evaluation; an optional `reward_se` or
    `success_rate_se` draws an error bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [h for h in history if "reward" in h]
    x = [h["step"] for h in steps]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 5), height_ratios=(2, 1))
    for axis, key, name, colour in (
        (top, "reward", "training reward", "C0"),
        (bottom, "success_rate", "training success", "C2"),
    ):
        values = [h[key] for h in steps]
        axis.plot(x, values, color=colour, alpha=0.3, linewidth=1)
        axis.plot(x, smoothed(values, smoothing), color=colour, linewidth=2, label=name)
        evals = [h for h in history if f"eval/{key}" in h]
        if evals:
            eval_x = [h["step"] for h in evals]
            axis.plot(
                eval_x, [h[f"eval/{key}"] for h in evals], "o--", color="C1", label=f"eval {key}"
            )
        labels = dict.fromkeys(point["label"] for point in held_out)
        for index, label in enumerate(labels):
            points = sorted((p for p in held_out if p["label"] == label), key=lambda p: p["step"])
            axis.errorbar(
                [p["step"] for p in points],
                [p[key] for p in points],
                yerr=[p.get(f"{key}_se", 0.0) for p in points],
                fmt="s:",
                color=f"C{3 + index}",
                markersize=7,
                capsize=4,
                label=f"held-out {label}",
            )
    top.set_ylabel("reward")
    top.legend(fontsize="small")
    bottom.legend(fontsize="small")
    bottom.set_ylabel("success rate")
    bottom.set_ylim(-0.05, 1.05)
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)


def smoothed(values: Sequence[float], weight: float = 0.8) -> list[float]:
    """Exponential moving average with bias correction (the first points are not pulled
    towards zero); `weight` 0 returns the values."""
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1), not {weight}")
    average, out = 0.0, []
    for count, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**count))
    return out


class Progress:
    """A tqdm bar of steps when `enabled`, else nothing; `advance(**figures)` either way (a
    context manager that closes the bar)."""

    def __init__(self, enabled: bool, desc: str, total: int | None, start: int = 0) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=start, desc=desc, unit="step")

    def advance(self, **figures: float) -> None:
        """One step, with its figures beside the bar (`success` as a percentage)."""
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(
                {k: f"{v:.0%}" if k == "success" else f"{v:.3g}" for k, v in figures.items()}
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
