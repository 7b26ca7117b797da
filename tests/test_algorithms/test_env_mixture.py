"""Several environments in one run (issue 29 item 3): rows name theirs in an `env` column (TRL's
convention) or get one drawn by weights per group; each episode sees only its own tools; the
log has each environment's reward and success rate."""

from __future__ import annotations

import pytest

import toolgym
from toolgym.agents import AgentLimits
from toolgym.algorithms import EnvMixture, GRPOConfig, GRPOTrainer
from toolgym.testing import tiny_model, tiny_tokenizer


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def mixed_rows(count: int) -> list[dict]:
    wordle = [{**row, "env": "wordle"} for row in toolgym.spec("Wordle-v0").dataset(count)]
    sums = [{"prompt": f"Add {i} and 3 with the tool.", "env": "sum"} for i in range(count)]
    return [row for pair in zip(wordle, sums, strict=True) for row in pair]


def test_rows_route_episodes_to_their_environment_and_tools(tmp_path):
    tokenizer = tiny_tokenizer()
    seen: list[tuple[str, set[str]]] = []

    def sum_only(prompts, completions, environments, trajectories, **_):
        """A per-environment reward: None (no reward) for the other environment's episodes."""
        for env, trajectory in zip(environments, trajectories, strict=True):
            seen.append((trajectory.row["env"], {t["function"]["name"] for t in env.tools}))
        return [0.5 if t.row["env"] == "sum" else None for t in trajectories]

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=2, max_new_tokens=8, max_episode_tokens=300),
        parser="hermes",
        progress_bar=False,
    )
    trainer = GRPOTrainer(
        tiny_model(tokenizer, seed=1),
        {"wordle": "Wordle-v0", "sum": [add]},
        mixed_rows(4),
        reward_funcs=[sum_only],
        args=args,
        tokenizer=tokenizer,
    )
    history = trainer.train()
    assert {name for name, _ in seen} == {"wordle", "sum"}
    for name, tools in seen:  # each episode saw only its own environment's tools
        assert tools == ({"guess"} if name == "wordle" else {"add"}), (name, tools)
    logged = set()
    for step in history:  # a step's 4 episodes, counted per environment
        names = {k.split("/")[1] for k in step if k.startswith("envs/")}
        assert sum(step[f"envs/{name}/episodes"] for name in names) == 4
        assert all(0.0 <= step[f"envs/{name}/success_rate"] <= 1.0 for name in names)
        logged |= names
    assert logged == {"wordle", "sum"}
    summary = trainer.evaluate(mixed_rows(2))
    assert summary["envs/sum/episodes"] == summary["envs/wordle/episodes"] == 2


def test_rows_without_the_column_draw_by_weight_one_environment_per_group():
    mixture = EnvMixture({"wordle": "Wordle-v0", "sum": [add]}, weights={"wordle": 0, "sum": 1})
    row: dict = {"prompt": "Go."}
    env = mixture(row, seed=3)
    assert row["env"] == "sum" and [t["function"]["name"] for t in env.tools] == ["add"]
    even = EnvMixture({"a": [add], "b": [add]})
    assert len({even.name_for({}, seed) for seed in range(40)}) == 2  # both are drawn
    assert {even.name_for({}, 7) for _ in range(5)} == {even.name_for({}, 7)}  # a group: one


def test_bad_mixtures_and_rows_are_named():
    mixture = EnvMixture({"wordle": "Wordle-v0"})
    with pytest.raises(ValueError, match="'chess'; the environments are wordle"):
        mixture({"env": "chess"}, seed=0)
    with pytest.raises(ValueError, match="'nope' is not among the environments"):
        EnvMixture({"wordle": "Wordle-v0"}, weights={"nope": 1.0})
    with pytest.raises(toolgym.UnknownEnvironmentError):
        EnvMixture({"x": "NoSuchEnv-v0"})
