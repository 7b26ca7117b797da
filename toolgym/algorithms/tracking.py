"""Training logs: metrics as JSONL (always), optional trackers, and the reward plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def plot_rewards(history: list[dict[str, Any]], path: str | Path) -> Path:
    """Reward and success rate over steps, written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history if "reward" in h]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, [h["reward"] for h in history if "reward" in h], label="mean reward")
    axis.plot(steps, [h["success_rate"] for h in history if "reward" in h], label="success rate")
    evals = [h for h in history if "eval/reward" in h]
    if evals:
        axis.plot(
            [h["step"] for h in evals],
            [h["eval/reward"] for h in evals],
            "o--",
            label="eval reward",
        )
    axis.set_xlabel("step")
    axis.set_ylim(-0.05, 1.05)
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)
