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


# The README's Python blocks run in order in one session, as a reader pasting them would; a
# block that loads SmolLM2 for training is what test_cli_and_examples.py runs more cheaply.
SESSION = [b for b in BLOCKS if "smollm2" not in b]


def _shown_outputs(block: str) -> list[str]:
    """The output a block shows in comments after its print() lines."""
    shown, lines = [], block.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("print(") and index + 1 < len(lines):
            comments = []
            for following in lines[index + 1 :]:
                if not following.startswith("# "):
                    break
                comments.append(following[2:])
            if comments:
                shown.append("\n".join(comments))
    return shown


def test_the_readme_blocks_run_in_order_and_print_what_they_show(capsys):
    namespace: dict = {}
    for index, block in enumerate(SESSION):
        exec(compile(block, f"README.md block {index}", "exec"), namespace)
        printed = capsys.readouterr().out
        for shown in _shown_outputs(block):
            assert shown in printed, f"block {index} shows {shown!r} but printed {printed!r}"
    assert namespace["env"].max_turns == 4  # make() with an override
    assert len(namespace["toolgym"].spec("myorg/Countdown-v0").dataset(3, seed=0)) == 3


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
