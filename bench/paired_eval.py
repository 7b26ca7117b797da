"""What seeded sampling (common random numbers) does to a paired held-out evaluation: the
standard error of the change between two sets of weights, on the same games, with each
game's sampling seeded the same before and after against unseeded sampling, same run.

The flagship's own setting (`examples/wordle.py`'s defaults: its game, limits, engine and
held-out games): `--before` and `--after` are the weights to compare, e.g. a run's warmed
weights (its warm-up cache entry, `model.safetensors`) and its final checkpoint. Each is
evaluated on `--games` held-out games at the training temperature, twice: seeded (the same
seed before and after) and unseeded. Printed per figure (reward, consistent guesses, wins):
the mean paired change ± its standard error in each arm, and the ratio of the errors.

    python bench/paired_eval.py --before CACHE/warmup/KEY/model.safetensors \\
        --after runs/wordle/checkpoint-12 --games 48
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import wordle  # the flagship's own settings, not a copy of them

from toolgym.agents.trajectory import load_jsonl
from toolgym.algorithms import GRPOTrainer

FIGURES = {
    "reward": lambda episode: episode.reward or 0.0,
    "consistent guesses": lambda episode: episode.env_metrics.get("consistent_guesses", 0.0),
    "wins": lambda episode: episode.env_metrics.get("win", 0.0),
}


def load_weights(trainer: GRPOTrainer, source: str) -> None:
    """Put `source` (a checkpoint folder or a `.safetensors` file) into the policy, then the
    engine."""
    if source.endswith(".safetensors"):
        from safetensors.torch import load_model

        load_model(trainer.learner.policy, source)
    else:
        trainer.learner.load(source)
    trainer.engine_weights.sync(0)


def play(trainer: GRPOTrainer, rows: list[dict], name: str, seed: int | None) -> list[Any]:
    """The episodes of `rows` at the training temperature (seeded or not)."""
    samples = f"paired-{name}.jsonl"
    trainer.evaluate(rows, trainer.args.temperature, samples_file=samples, seed=seed)
    return load_jsonl(Path(trainer.args.output_dir) / samples)


def change(before: list[Any], after: list[Any], figure: str) -> tuple[float, float]:
    """Mean paired change of `figure` and its standard error."""
    read = FIGURES[figure]
    return wordle.paired_difference([read(e) for e in before], [read(e) for e in after])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="checkpoint folder or .safetensors")
    parser.add_argument("--after", required=True, help="checkpoint folder or .safetensors")
    parser.add_argument("--games", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0, help="the flagship run's --seed")
    parser.add_argument("--output-dir", default="runs/paired-eval")
    options = parser.parse_args()
    args = wordle.build_parser().parse_args(
        ["--seed", str(options.seed), "--eval-games", str(options.games)]
    )
    args.output_dir = options.output_dir
    _, _, rows = wordle.datasets(args)
    trainer = GRPOTrainer(
        args.model,
        "Wordle-v0",
        rows,
        args=wordle.config_from(args),
        env_kwargs=wordle.game_kwargs(args),
    )
    episodes: dict[tuple[str, str], list[Any]] = {}
    started = time.perf_counter()
    for weights in ("before", "after"):
        load_weights(trainer, getattr(options, weights))
        for arm, seed in (("seeded", options.seed), ("unseeded", None)):
            episodes[arm, weights] = play(trainer, rows, f"{arm}-{weights}", seed)
    seconds = time.perf_counter() - started
    print(f"{options.games} held-out games per evaluation, 4 evaluations in {seconds:.0f} s")
    for figure in FIGURES:
        arms = {
            arm: change(episodes[arm, "before"], episodes[arm, "after"], figure)
            for arm in ("seeded", "unseeded")
        }
        shown = "; ".join(f"{arm} {mean:+.3f} ± {error:.3f}" for arm, (mean, error) in arms.items())
        ratio = arms["seeded"][1] / arms["unseeded"][1] if arms["unseeded"][1] else float("nan")
        print(f"{figure:19} {shown}; standard error seeded / unseeded {ratio:.2f}x")
    same = [
        statistics.fmean(
            a.completion_ids == b.completion_ids
            for a, b in zip(episodes[arm, "before"], episodes[arm, "after"], strict=True)
        )
        for arm in ("seeded", "unseeded")
    ]
    print(
        f"games played token for token alike before and after: seeded {same[0]:.0%}, "
        f"unseeded {same[1]:.0%}"
    )
    trainer.close()


if __name__ == "__main__":
    main()
