"""The gymnasium view: gymnasium's env checker, text actions and observations."""

from __future__ import annotations

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import toolgym
from toolgym import MalformedToolCall, ToolCall
from toolgym.gym import GymnasiumEnv, parse_action

BUILTINS = ["Wordle-v0", "Arithmetic-v0", "GuessNumber-v0"]


@pytest.mark.parametrize("env_id", BUILTINS)
def test_gymnasium_env_checker_passes(env_id):
    env = gymnasium.make(f"toolgym/{env_id}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test
        check_env(env.unwrapped)
    assert isinstance(env.unwrapped, gymnasium.Env)


def test_reset_with_a_dataset_row_as_options():
    env = gymnasium.make("toolgym/Wordle-v0")
    row = toolgym.spec("Wordle-v0").dataset(1, seed=0)[0]
    obs, info = env.reset(seed=0, options={**row, "answer": "crane"})
    assert obs.startswith("Let's play Wordle")
    assert info["tools"][0]["function"]["name"] == "guess"
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "guess", "arguments": {"word": "crane"}}</tool_call>'
    )
    assert "Correct!" in obs
    assert (reward, terminated, truncated) == (1.0, True, False)


def test_same_seed_same_episode():
    env = gymnasium.make("toolgym/GuessNumber-v0")
    env.reset(seed=7)
    first = [env.step(f'{{"name": "guess", "arguments": {{"n": {n}}}}}')[0] for n in (50, 25, 75)]
    env.reset(seed=7)
    again = [env.step(f'{{"name": "guess", "arguments": {{"n": {n}}}}}')[0] for n in (50, 25, 75)]
    assert first == again


def test_final_answer_grades_and_terminates():
    env = gymnasium.make("toolgym/Arithmetic-v0", render_mode="ansi")
    env.reset(seed=0, options={"a": 4821, "b": 9384, "operation": "multiply"})
    obs, reward, terminated, *_ = env.step(
        '{"name": "multiply", "arguments": {"a": 4821, "b": "9384"}}'
    )
    assert obs == "multiply: 45240264"
    assert not terminated
    obs, reward, terminated, _truncated, info = env.step("The product is 45,240,264.")
    assert (reward, terminated, info["final_answer"]) == (1.0, True, True)
    assert "assistant: The product is 45,240,264." in env.render()


def test_malformed_action_is_an_error_observation_not_an_answer():
    env = GymnasiumEnv(toolgym.make("GuessNumber-v0"))
    env.reset(seed=0)
    obs, _reward, terminated, _truncated, info = env.step(
        '<tool_call>{"name": "guess", "arguments": </tool_call>'
    )
    assert "could not parse the tool call" in obs
    assert not terminated
    assert info["failures"][0]["kind"] == "malformed"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>', [ToolCall("a", {"x": 1})]),
        (
            'think first <tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>'
            '<tool_call>{"name": "b", "arguments": "{}"}</tool_call>',
            [ToolCall("a", {}), ToolCall("b", "{}")],
        ),
        ('{"name": "a", "parameters": {"x": 2}}', [ToolCall("a", {"x": 2})]),
        ('[{"name": "a"}, {"name": "b", "arguments": {}}]', [ToolCall("a", {}), ToolCall("b", {})]),
        ("The answer is 42.", []),
        ("[1, 2, 3]", []),
        ("{not json", []),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_parse_action_reports_broken_blocks():
    (call,) = parse_action('<tool_call>{"name": "a", "arguments": {')
    assert isinstance(call, MalformedToolCall)
    assert "invalid JSON" in call.reason
    (call,) = parse_action('<tool_call>["a"]</tool_call>')
    assert isinstance(call, MalformedToolCall)
