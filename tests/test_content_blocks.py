"""Tools that return content blocks (issue 29 item 4), as TRL and MCP pass them: text blocks are
joined into the tool message; an image ends the episode at that call with a named error
(`env_error`, left out of the loss) instead of a `bad_result` the model reads at every call."""

from __future__ import annotations

import shutil

import pytest

import toolgym
from toolgym.envs.tools import render_result


class Screens(toolgym.Environment):
    def reset(self) -> str:
        return "Look around."

    def look(self) -> list:
        """Describe the room."""
        return [{"type": "text", "text": "a room"}, {"type": "text", "text": "a door"}]

    def screenshot(self) -> list:
        """Take a screenshot."""
        return [{"type": "text", "text": "here:"}, {"type": "image", "image": "<pixels>"}]


def test_text_blocks_are_joined_and_other_lists_stay_json():
    assert render_result([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"
    assert render_result([{"kind": "text"}]) == '[{"kind": "text"}]'  # not content blocks
    assert render_result([]) == "[]"


@pytest.mark.parametrize("where", ["local", "process"])
def test_an_image_ends_the_episode_naming_it_once(where):
    if where == "process" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    env = toolgym.sandbox.sandboxed(Screens, {}, where)
    try:
        env.reset(seed=0)
        assert env.step(toolgym.ToolCall("look")).messages[0]["content"] == "a room\na door"
        step = env.step([toolgym.ToolCall("screenshot"), toolgym.ToolCall("look")])
        assert step.terminated and step.info["ended"] == "env_error", step.info
        assert "'image' content" in step.messages[0]["content"]
        assert step.results[1].failure == "episode_over"  # nothing after it runs
    finally:
        env.close()
