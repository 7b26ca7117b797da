"""Splitting a run's time budget between a warm-up, paired evaluations and RL steps.

A run of the shape warm-up -> evaluation -> RL -> the same evaluation again spends a fixed
budget. How long each stage takes depends on the machine (a CPU without AVX-512 took twice as
long per warm-up game as one with it) and on whether the warm-up was cached. `plan_budget`
sizes the warm-up (games, in whole optimizer steps) and the evaluation (games per mode, the same
games before and after, so the change is paired) from measured speeds so that RL keeps at least
`grpo_share` of the whole budget, shrinking warm-up and evaluation together, never below their
floors. The functions are pure: the speeds are inputs (`Speeds`), measured by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Speeds:
    """Seconds per unit of each stage on this machine.

    Attributes:
        warmup_game: Warm-up training per demonstration game and epoch.
        eval_game: One held-out game in one evaluation pass (one mode, before RL).
        grpo_step: One RL step (rollouts and update).
    """

    warmup_game: float
    eval_game: float
    grpo_step: float

    def __post_init__(self) -> None:
        for name in ("warmup_game", "eval_game", "grpo_step"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Speeds.{name} must be a positive number of seconds")

    @classmethod
    def from_warmup(cls, warmup_game: float, eval_ratio: float, step_ratio: float) -> Speeds:
        """Speeds from the warm-up's seconds per game and the measured ratios of an evaluation
        game and of an RL step to it (the ratios held within 6% across two CPUs whose warm-up
        speeds differ 2.15 times)."""
        return cls(warmup_game, warmup_game * eval_ratio, warmup_game * step_ratio)


@dataclass(frozen=True)
class BudgetRequest:
    """What a run wants and what it has already spent.

    Attributes:
        budget: Wall seconds for the whole run.
        spent: Seconds already spent (model load, engine start, the speed probe, a warm-up).
        warmup_games: Demonstrations wanted (the most); 0 when the warm-up is done or cached.
        eval_games: Held-out games per evaluation mode wanted (the most).
        min_warmup_games: The warm-up's floor (when one is wanted at all).
        min_eval_games: The evaluation's floor: with 16 paired games the standard error of the
            change rests on 15 degrees of freedom (its own relative error about 18%).
        warmup_batch: Warm-up games per optimizer step: the warm-up is sized in whole steps.
        warmup_epochs: Passes over the demonstrations (each costs `Speeds.warmup_game` a game).
        eval_passes: Evaluation passes still to play, in before-RL game times (greedy and
            sampled, before and after: 4, plus a quarter for the after-RL games' greater
            length: 4.5; 2.25 once the first evaluation is done).
        reserve: Seconds kept for the checkpoint, the plot and the summary.
        grpo_share: The share of `budget` that RL keeps at least, when the floors allow.
    """

    budget: float
    spent: float
    warmup_games: int
    eval_games: int
    min_warmup_games: int = 64
    min_eval_games: int = 16
    warmup_batch: int = 8
    warmup_epochs: int = 1
    eval_passes: float = 4.5
    reserve: float = 30.0
    grpo_share: float = 0.6

    def __post_init__(self) -> None:
        if self.budget <= 0 or self.spent < 0 or self.reserve < 0:
            raise ValueError("BudgetRequest: budget must be positive, spent and reserve >= 0")
        if not 0 < self.grpo_share < 1:
            raise ValueError(f"BudgetRequest.grpo_share {self.grpo_share} must be in (0, 1)")
        if min(self.warmup_games, self.eval_games, self.min_warmup_games) < 0:
            raise ValueError("BudgetRequest: game counts must not be negative")
        if self.warmup_batch < 1 or self.min_eval_games < 1:
            raise ValueError("BudgetRequest: warmup_batch and min_eval_games must be >= 1")


@dataclass(frozen=True)
class BudgetPlan:
    """Games per stage, the seconds each is expected to take, and why.

    Attributes:
        warmup_games: Demonstrations to train on (0: none left to train).
        eval_games: Held-out games per evaluation mode, the same before and after RL.
        seconds: Expected seconds per part: "spent", "warm-up", "evaluation", "reserve",
            "grpo" (what is left); they add up to the budget.
        grpo_steps: RL steps expected in the "grpo" seconds.
        reason: One sentence on how the split was chosen.
    """

    warmup_games: int
    eval_games: int
    seconds: dict[str, float]
    grpo_steps: int
    reason: str

    def shares(self) -> dict[str, float]:
        """Each part's share of the budget."""
        total = sum(self.seconds.values())
        return {name: value / total for name, value in self.seconds.items()}

    def describe(self) -> str:
        """The split in one line: seconds and shares per part, then the reason."""
        shares = self.shares()
        parts = ", ".join(
            f"{name} {value:.0f} s ({shares[name]:.0%})" for name, value in self.seconds.items()
        )
        return f"{parts}; ~{self.grpo_steps} GRPO steps. {self.reason}"


def plan_budget(request: BudgetRequest, speeds: Speeds) -> BudgetPlan:
    """Size the warm-up and the evaluation so that RL keeps `grpo_share` of the budget.

    The wanted sizes are kept when they leave RL its share. Otherwise warm-up and evaluation
    shrink by the same fraction (the warm-up in whole optimizer steps), each stopping at its
    floor; if even the floors leave RL less than its share, the floors are used and RL gets
    what is left (the reason says so).
    """
    r = request
    free = r.budget - r.spent - r.reserve
    target = r.grpo_share * r.budget

    def cost(warmup: int, evaluation: int) -> float:
        warmup_cost = warmup * r.warmup_epochs * speeds.warmup_game
        return warmup_cost + evaluation * r.eval_passes * speeds.eval_game

    floor_w = min(r.warmup_games, r.min_warmup_games)
    floor_e = min(r.eval_games, r.min_eval_games)
    if free - cost(r.warmup_games, r.eval_games) >= target:
        warmup, evaluation = r.warmup_games, r.eval_games
        reason = f"the wanted sizes leave GRPO at least {r.grpo_share:.0%} of the budget"
    else:
        warmup, evaluation = floor_w, floor_e
        for candidate in _warmup_sizes(r.warmup_games, floor_w, r.warmup_batch):
            fraction = candidate / r.warmup_games if r.warmup_games else 1.0
            wanted = max(floor_e, min(r.eval_games, int(r.eval_games * fraction)))
            fits = [
                e for e in range(wanted, floor_e - 1, -1) if free - cost(candidate, e) >= target
            ]
            if fits:
                warmup, evaluation = candidate, fits[0]
                break
        if free - cost(warmup, evaluation) >= target:
            reason = (
                f"warm-up and evaluation shrunk from {r.warmup_games} and {r.eval_games} games "
                f"so that GRPO keeps {r.grpo_share:.0%} of the budget at this machine's speed"
            )
        else:
            reason = (
                f"even the floors ({floor_w} warm-up games, {floor_e} evaluation games per "
                f"mode) leave GRPO less than {r.grpo_share:.0%} of the budget at this "
                "machine's speed"
            )
    warmup_seconds = warmup * r.warmup_epochs * speeds.warmup_game
    eval_seconds = evaluation * r.eval_passes * speeds.eval_game
    grpo = max(free - warmup_seconds - eval_seconds, 0.0)
    seconds = {
        "spent": r.spent,
        "warm-up": warmup_seconds,
        "evaluation": eval_seconds,
        "reserve": r.reserve,
        "grpo": grpo,
    }
    return BudgetPlan(warmup, evaluation, seconds, int(grpo // speeds.grpo_step), reason)


def _warmup_sizes(wanted: int, floor: int, batch: int) -> list[int]:
    """Warm-up sizes from `wanted` down to `floor`: `wanted`, then whole multiples of `batch`
    below it, then `floor`."""
    sizes = [wanted, *range((wanted - 1) // batch * batch, floor, -batch)]
    return [s for s in sizes if s > floor] + [floor] if wanted > floor else [wanted]
