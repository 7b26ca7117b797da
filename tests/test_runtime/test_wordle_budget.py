"""The time-budget planner (toolgym.runtime.budget) on the two measured machine profiles of
docs/training.md: a 2-core Xeon with AVX-512 (warm-up 328 s for 96 games, four 32-game
evaluations 184 s, 57 s per GRPO step) and a 2-core AMD EPYC with AVX2 only (706 s, 419 s, and
4 GRPO steps in 503 s). Made-up speeds in, the plan's shares out; no model runs."""

from __future__ import annotations

import pytest

from toolgym.runtime.budget import BudgetRequest, Speeds, plan_budget

FAST = Speeds(warmup_game=328.2 / 96, eval_game=184.5 / 128, grpo_step=57.0)
SLOW = Speeds(warmup_game=706.0 / 96, eval_game=419.0 / 128, grpo_step=503.0 / 4)
BUDGET = 1800.0


def request(spent: float, cached: bool) -> BudgetRequest:
    """The example's default request: 96 demonstrations, 32 held-out games per mode."""
    return BudgetRequest(BUDGET, spent, warmup_games=0 if cached else 96, eval_games=32)


def test_fast_cold_run_keeps_the_default_sizes() -> None:
    plan = plan_budget(request(spent=32.0, cached=False), FAST)
    assert (plan.warmup_games, plan.eval_games) == (96, 32)
    assert plan.shares()["grpo"] >= 0.6
    assert plan.grpo_steps == 21  # the measured seed-0 run made 21 steps
    assert sum(plan.seconds.values()) == pytest.approx(BUDGET)


def test_slow_cold_run_gives_grpo_the_larger_share() -> None:
    """The measured cold run on the AVX2-only CPU gave GRPO 503 s (28%): 4 steps."""
    plan = plan_budget(request(spent=69.0, cached=False), SLOW)
    shares = plan.shares()
    assert shares["grpo"] >= 0.5
    assert shares["grpo"] > shares["warm-up"] + shares["evaluation"]
    assert plan.grpo_steps >= 7
    assert 64 <= plan.warmup_games < 96 and plan.warmup_games % 8 == 0
    assert plan.eval_games >= 16  # the floor for a usable paired standard error
    assert "floors" in plan.reason


@pytest.mark.parametrize("speeds", [FAST, SLOW], ids=["fast", "slow"])
def test_a_cached_warmup_gives_its_time_to_grpo(speeds: Speeds) -> None:
    spent = 32.0 if speeds is FAST else 69.0
    cold = plan_budget(request(spent, cached=False), speeds)
    warm = plan_budget(request(spent, cached=True), speeds)
    assert warm.seconds["warm-up"] == 0 and warm.eval_games == 32
    assert warm.seconds["grpo"] > cold.seconds["grpo"]
    assert warm.shares()["grpo"] >= 0.65


def test_sizes_shrink_together_when_the_share_needs_it() -> None:
    """A machine 1.5x slower than the fast one: between the wanted sizes and the floors."""
    speeds = Speeds(FAST.warmup_game * 1.5, FAST.eval_game * 1.5, FAST.grpo_step * 1.5)
    plan = plan_budget(request(spent=45.0, cached=False), speeds)
    assert 64 <= plan.warmup_games < 96 and 16 <= plan.eval_games <= 32
    assert plan.shares()["grpo"] >= 0.6
    assert "shrunk" in plan.reason


def test_each_warmup_epoch_costs_a_pass_over_the_games() -> None:
    """Three passes over the demonstrations cost three times one pass: on the fast machine
    the default sizes no longer leave GRPO its share, so the warm-up shrinks to its floor
    (and even that leaves GRPO less, which the reason says)."""
    one = plan_budget(request(spent=32.0, cached=False), FAST)
    three = plan_budget(
        BudgetRequest(BUDGET, 32.0, warmup_games=96, eval_games=32, warmup_epochs=3), FAST
    )
    assert three.seconds["warm-up"] == pytest.approx(3 * three.warmup_games * FAST.warmup_game)
    assert three.warmup_games == 64 < one.warmup_games
    assert "floors" in three.reason


def test_replanning_after_the_warmup_keeps_the_floor_and_the_share() -> None:
    """After a 64-game warm-up on the slow CPU the evaluation is sized again from what is left:
    it never drops below the floor, whatever the share."""
    plan = plan_budget(BudgetRequest(BUDGET, 69.0 + 470.0, 0, 32), SLOW)
    assert plan.eval_games == 16 and plan.warmup_games == 0
    assert plan.seconds["grpo"] > 0


def test_describe_names_every_part_and_the_reason() -> None:
    plan = plan_budget(request(spent=32.0, cached=False), FAST)
    text = plan.describe()
    for part in ("spent", "warm-up", "evaluation", "reserve", "grpo", plan.reason):
        assert part in text


def test_speeds_from_the_warmup_ratios() -> None:
    speeds = Speeds.from_warmup(2.0, eval_ratio=0.43, step_ratio=17.0)
    assert speeds.eval_game == pytest.approx(0.86) and speeds.grpo_step == pytest.approx(34.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Speeds(0.0, 1.0, 1.0),
        lambda: BudgetRequest(0.0, 0.0, 96, 32),
        lambda: BudgetRequest(BUDGET, 0.0, 96, 32, grpo_share=1.5),
        lambda: BudgetRequest(BUDGET, 0.0, -1, 32),
    ],
)
def test_bad_input_is_refused(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_the_example_stops_when_its_plan_leaves_no_grpo_step(monkeypatch) -> None:
    """On a machine too loaded or slow for the budget (a measured case: load 6 planned 0
    steps), the example says so and stops instead of spending the budget on a warm-up and
    evaluations that no GRPO step follows."""
    import argparse
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    import wordle

    crawling = Speeds(warmup_game=60.0, eval_game=30.0, grpo_step=3000.0)
    plan = plan_budget(request(spent=600.0, cached=False), crawling)
    assert plan.grpo_steps == 0
    args = argparse.Namespace(time_budget=BUDGET, steps=100)
    with pytest.raises(SystemExit, match=r"leaves GRPO no step.*--time-budget 3600.*TOOLGYM_CACHE"):
        wordle.stop_without_grpo(plan, args)
    wordle.stop_without_grpo(plan, argparse.Namespace(time_budget=BUDGET, steps=0))  # asked for
    sys.modules.pop("wordle", None)


def test_the_examples_plan_on_an_epyc_without_amx_keeps_a_48_game_evaluation(
    monkeypatch,
) -> None:
    """The example's own request on the speeds measured on a 2-core AMD EPYC without AMX
    (2026-12-07: 6.78 s per warm-up game in the probe; 0.25 and 10 times that per evaluation
    game and GRPO step). It keeps the 72-game warm-up and 64 sampled held-out games, and on
    a machine twice as slow the evaluation stops at its floor of 48 games, where a seeded
    paired change of consistent guesses had a standard error of 0.19."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    import wordle

    args = wordle.build_parser().parse_args([])
    args.time_budget = BUDGET  # main()'s default
    assert (args.eval_games, args.min_eval_games, args.greedy_share) == (64, 48, 0.0)
    for probe, sizes in ((6.78, (72, 64)), (13.56, (64, 48))):
        speeds = Speeds.from_warmup(probe, wordle.EVAL_RATIO, wordle.step_ratio(args))
        plan = plan_budget(wordle.budget_request(args, 38.0, args.warmup_games), speeds)
        assert (plan.warmup_games, plan.eval_games) == sizes
        assert plan.seconds["evaluation"] == pytest.approx(sizes[1] * 2.25 * speeds.eval_game)
    sys.modules.pop("wordle", None)


def test_the_summary_table_shows_greedy_rows_only_when_greedy_games_were_played(
    monkeypatch,
) -> None:
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    import wordle

    def figures(rewards: list[float]) -> dict:
        skills = [{"win": r} | {key: 2 * r for key in wordle.SKILLS} for r in rewards]
        return {
            "reward": sum(rewards) / len(rewards),
            "success_rate": 0.5,
            "episodes": len(rewards),
            "env": {"consistent_guesses": 1.0},
            "statuses": {"env_done": len(rewards)},
            "rewards": rewards,
            "skills": skills,
        }

    before, after = {"sampled": figures([0.0, 1.0])}, {"sampled": figures([1.0, 1.0])}
    table = wordle.summary_table(before, after)
    assert "greedy" not in table and "(2 games sampled;" in table
    assert "+0.500 ± 0.500" in table  # the reward's paired change
    assert "+1.00±1.00" in table  # consistent guesses: 2 x the reward here
    assert "50.0% ± 35.4%" in table and "+50.0% ± 50.0%" in table  # win rate; wins' change
    before["greedy"], after["greedy"] = figures([0.0]), figures([1.0])
    table = wordle.summary_table(before, after)
    assert "greedy change" in table and "the first 1 of them also greedily" in table
    assert [wordle.greedy_games(64, share) for share in (0.0, 0.01, 0.5, 1.0)] == [0, 1, 32, 64]
    sys.modules.pop("wordle", None)
