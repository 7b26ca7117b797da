"""The run viewer on a run with several environments (issue 29 item 3): a tiny real GRPO run over
two environments routed by the rows' `env` column logs `envs/<name>/...` figures, and the page,
in a real headless Chromium (tests/browser.py), draws them in one "Environments" group, a chart
per figure of each environment, each point at its logged value. Skips without Chromium unless
TOOLGYM_REQUIRE_BROWSER=1, as tests/test_viewer/test_viewer.py does."""

from __future__ import annotations

import json
from pathlib import Path

from browser import Browser
from test_viewer import READY, js, needs_browser, save_screenshot

import toolgym
from toolgym.agents import AgentLimits
from toolgym.algorithms import GRPOConfig, GRPOTrainer
from toolgym.testing import tiny_model, tiny_tokenizer
from toolgym.viewer import start


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def sum_reward(prompts, completions, trajectories, **_) -> list[float | None]:
    """The sum environment's reward (it has none of its own); None for Wordle's episodes."""
    return [0.5 if t.row["env"] == "sum" else None for t in trajectories]


def train_two_environment_run(folder: Path) -> list[dict]:
    """Two GRPO steps of the tiny model over Wordle and a function-list environment, each step
    the whole dataset (two prompts of each, so both environments in every step); the
    metrics.jsonl rows."""
    wordle = [{**row, "env": "wordle"} for row in toolgym.spec("Wordle-v0").dataset(2)]
    sums = [{"prompt": f"Add {i} and 3 with the tool.", "env": "sum"} for i in range(2)]
    args = GRPOConfig(
        output_dir=str(folder),
        max_steps=2,
        prompts_per_step=4,
        num_generations=2,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=2, max_new_tokens=8, max_episode_tokens=300),
        parser="hermes",
        progress_bar=False,
    )
    tokenizer = tiny_tokenizer()
    GRPOTrainer(
        tiny_model(tokenizer, seed=1),
        {"wordle": "Wordle-v0", "sum": [add]},
        wordle + sums,
        reward_funcs=[sum_reward],
        args=args,
        tokenizer=tokenizer,
    ).train()
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@needs_browser
def test_the_environments_group_shows_each_environments_curves(tmp_path):
    steps = train_two_environment_run(tmp_path / "run")
    logged = sorted({key for row in steps for key in row if key.startswith("envs/")})
    names = {key.split("/")[1] for key in logged}
    assert names == {"wordle", "sum"}, logged  # the run logged both environments' figures
    for name in names:  # in every step: each environment's figures are curves
        assert all(f"envs/{name}/reward" in row for row in steps) and len(steps) == 2
    with start(tmp_path / "run") as viewer, Browser() as browser:
        browser.goto(viewer.url, ready=READY)
        browser.wait_for("!!document.querySelector('.curve-group')")
        charts = js(
            browser,
            "Object.fromEntries([...document.querySelectorAll('.curve-group')].map(g =>"
            " [g.dataset.group, [...g.querySelectorAll('figure')].map(f => f.dataset.key)]))",
        )
        assert sorted(charts["Environments"]) == logged
        others = [key for group, keys in charts.items() if group != "Environments" for key in keys]
        assert not [key for key in others if key.startswith("envs/")]
        for key in logged:
            points = f"[...document.querySelectorAll('figure[data-key=\"{key}\"] circle.pt')]"
            plotted = js(browser, f"{points}.map(c => [Number(c.dataset.step), c.dataset.value])")
            expected = [[row["step"], row[key]] for row in steps if key in row]
            assert [[step, float(value)] for step, value in plotted] == expected, key
        save_screenshot(browser, tmp_path, "viewer-environments.png")
        assert not browser.errors and not js(browser, "document.body.dataset.error || ''")
