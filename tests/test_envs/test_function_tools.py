"""Plain tool functions as an environment (TRL's `tools=[...]`), and functions set on a class
as attributes refused with the reason instead of failing at every call."""

from __future__ import annotations

import pytest

import toolgym
from toolgym.envs.tools import ToolSchemaError


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


async def shout(text: str) -> str:
    """Shout.

    Args:
        text: What to shout.
    """
    return text.upper()


def test_a_list_of_functions_is_an_environment():
    env = toolgym.as_environment([add, shout])
    assert [t["function"]["name"] for t in env.tools] == ["add", "shout"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert env.reset(seed=0, question="anything") is None
    step = env.step(
        [toolgym.ToolCall("add", {"a": 2, "b": 3}), toolgym.ToolCall("shout", {"text": "hi"})]
    )
    assert [m["content"] for m in step.messages] == ["5", "HI"]
    # values reach the function as sent, as TRL passes them (no "3" -> 3): its error, as TRL's
    bad = env.step(toolgym.ToolCall("add", {"a": 2, "b": "3"}))
    assert bad.messages[0]["content"] == str(
        {"error": "unsupported operand type(s) for +: 'int' and 'str'"}
    )
    assert bad.results[0].failure == "tool_exception"
    missing = env.step(toolgym.ToolCall("add", {"a": 2}))
    assert "missing required argument 'b'" in missing.messages[0]["content"]
    assert missing.results[0].failure == "invalid_arguments"
    assert env.get_reward() is None  # reward functions score such an episode


def test_an_agent_plays_function_tools():
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    call = '<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call><|im_end|>'
    agent = scripted_agent(tiny_tokenizer(), [call, "42<|im_end|>"])
    (trajectory,) = agent.run([[add, shout]], [{"prompt": "What is 40 + 2?"}])
    assert trajectory.status == "finished" and trajectory.reward is None
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["42"]


def test_bad_function_lists_are_named():
    def _private(x: int) -> int:
        """Private.

        Args:
            x: A number.
        """
        return x

    with pytest.raises(ToolSchemaError, match="'_private' cannot be a tool: its name is private"):
        toolgym.as_environment([add, _private])
    with pytest.raises(ToolSchemaError, match="'add' cannot be a tool"):
        toolgym.as_environment([add, add])


def test_a_function_set_as_a_class_attribute_is_refused_with_the_reason():
    class Calculator:
        plus = add  # Python would pass the instance as `a`

        def reset(self, **kwargs):
            return None

    with pytest.raises(ToolSchemaError, match=r"Calculator.plus is the function .*add set as a"):
        toolgym.as_environment(Calculator())


def test_a_class_nested_in_a_function_gets_a_one_line_sandbox_error():
    """As TRL's OpenEnv example scripts write their classes: the worker cannot import it, so
    the error says where to move it, instead of an opaque AttributeError from the worker."""
    from toolgym.sandbox import SandboxError, sandboxed

    def make_class():
        class Local(toolgym.Environment):
            def reset(self) -> str:
                return "hi"

        return Local

    with pytest.raises(SandboxError, match=r"make_class.<locals>.Local is defined inside a"):
        sandboxed(make_class(), {}, "process")
