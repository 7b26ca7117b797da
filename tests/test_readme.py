"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


@pytest.fixture(autouse=True)
def restore_registry():
    import gymnasium

    from toolgym import registry

    before, gym_before = dict(registry._registry), set(gymnasium.registry)
    yield
    registry._registry.clear()
    registry._registry.update(before)
    for gym_id in set(gymnasium.registry) - gym_before:
        del gymnasium.registry[gym_id]


# Skipped blocks: one uses a placeholder builder; the SmolLM2 agent example is what
# test_cli_and_examples.py::test_eval_the_embedded_smollm2_on_wordle runs, more cheaply.
RUNNABLE = [i for i, b in enumerate(BLOCKS) if "my_dataset_builder" not in b and "smollm2" not in b]


@pytest.mark.parametrize("index", RUNNABLE)
def test_readme_block_runs(index, capsys):
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {})
    if "print(result.messages" in BLOCKS[index]:
        assert "Guess 1/6: S(gray) L(gray) A(green) T(gray) E(green)" in capsys.readouterr().out


def test_readme_registration_block_makes_with_overrides():
    namespace: dict = {"my_dataset_builder": lambda n, seed: [{"prompt": "go"}] * n}
    exec(compile(next(b for b in BLOCKS if "class Countdown" in b), "README", "exec"), namespace)
    block = next(b for b in BLOCKS if 'register("myorg/Countdown-v0"' in b)
    exec(compile(block, "README.md registration", "exec"), namespace)
    assert namespace["env"].max_turns == 4


def test_readme_custom_environment_plays():
    namespace: dict = {}
    block = next(b for b in BLOCKS if "class Countdown" in b)
    exec(compile(block, "README.md custom environment", "exec"), namespace)
    env = namespace["env"]
    assert env.reset(target=12) == "Reach exactly 12."
    import toolgym

    result = env.step(
        [toolgym.ToolCall("add", {"amount": 9}), toolgym.ToolCall("add", {"amount": "3"})]
    )
    assert [m["content"] for m in result.messages] == ["The total is 9.", "The total is 12."]
    assert result.terminated and result.reward == 1.0
    env.reset(target=12)
    refused = env.step(toolgym.ToolCall("add", {"amount": 10}))
    assert refused.messages[0]["content"] == "Error: amount must be between 1 and 9"
    assert refused.info["tool_failures"] == 1
