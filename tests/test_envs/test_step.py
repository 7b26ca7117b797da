"""Every way a model can get a tool call wrong ends in a tool message, never an exception."""

from __future__ import annotations

import asyncio
import json
import time
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import toolgym
from toolgym import MalformedToolCall, ToolCall


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Counter(toolgym.Environment):
    max_turns = 3

    def reset(self, start: int = 0) -> str | None:
        self.value = start
        return f"The counter is at {start}."

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: How much to add.
        """
        self.value += amount
        self.reward = float(self.value)
        return self.value

    def finish(self) -> str:
        """End the episode."""
        self.done = True
        return "bye"

    def crash(self) -> str:
        """A tool with a bug."""
        raise KeyError("boom")

    def refuse(self) -> str:
        """A tool that rejects the model's request."""
        raise toolgym.ToolError("not like that")

    def unserialisable(self) -> object:
        """Returns something that is neither JSON nor text."""
        return Unprintable()

    def exact(self) -> object:
        """Returns numbers that are not JSON."""
        return Decimal("0.1")

    def report(self) -> dict:
        """Returns structured data."""
        return {"value": self.value, "items": [1, 2]}

    async def slow_add(self, amount: int) -> int:
        """Add after a pause.

        Args:
            amount: How much to add.
        """
        await asyncio.sleep(0.01)
        return self.add(amount)


@pytest.fixture
def env() -> toolgym.Stepper:
    env = toolgym.as_environment(Counter())
    assert env.reset(start=1, seed=0) == "The counter is at 1."
    return env


def one(env: toolgym.Stepper, call) -> tuple[str, dict]:
    result = env.step(call)
    assert len(result.messages) == 1
    return result.messages[0]["content"], result.info


def test_a_good_call_returns_the_value_and_the_reward_delta(env):
    result = env.step(ToolCall("add", {"amount": 2}))
    assert result.messages == [{"role": "tool", "name": "add", "content": "3"}]
    assert result.reward == pytest.approx(3.0)  # 0 -> 3
    assert result.info["tool_failures"] == 0
    assert not result.terminated and not result.truncated


def test_arguments_as_json_string_and_numbers_as_strings(env):
    content, info = one(env, ToolCall("add", '{"amount": "41"}'))
    assert content == "42"
    assert info["tool_failures"] == 0


def test_openai_style_dict_and_call_id(env):
    result = env.step(
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"amount": 1}'}}
    )
    assert result.messages == [
        {"role": "tool", "name": "add", "content": "2", "tool_call_id": "c1"}
    ]


@pytest.mark.parametrize(
    ("call", "kind", "fragment"),
    [
        (
            ToolCall("nope"),
            "unknown_tool",
            "unknown tool 'nope'. Available tools: add(amount: integer)",
        ),
        (ToolCall("add", {}), "invalid_arguments", "missing required argument 'amount'"),
        (
            ToolCall("add", {"amount": 1, "extra": 2}),
            "invalid_arguments",
            "unexpected argument 'extra'",
        ),
        (ToolCall("add", {"amount": "ten"}), "invalid_arguments", "argument 'amount'"),
        (ToolCall("add", "{amount: 1"), "invalid_arguments", "not valid JSON"),
        (ToolCall("add", "[1]"), "invalid_arguments", "must be a JSON object"),
        (ToolCall("crash"), "tool_exception", "crash raised KeyError: 'boom'"),
        (ToolCall("refuse"), "tool_error", "Error: not like that"),
        (ToolCall("unserialisable"), "bad_result", "is not JSON and cannot be shown as text"),
        (MalformedToolCall("<tool_call>{", "invalid JSON"), "malformed", "could not parse"),
        ({"arguments": {}}, "malformed", "needs a 'name'"),
        ("not a call", "malformed", "needs a 'name'"),
    ],
)
def test_bad_calls_become_error_messages(env, call, kind, fragment):
    content, info = one(env, [call])
    assert fragment in content
    assert content.startswith("Error")
    assert info["tool_failures"] == 1
    assert info["failures"][0]["kind"] == kind


def test_a_result_that_is_not_json_shows_as_str_shows_it(env):
    """As TRL and BFCL show results (BFCL's `logarithm` returns an mpmath number)."""
    content, info = one(env, ToolCall("exact"))
    assert content == "0.1" and info["tool_failures"] == 0


def test_invalid_arguments_message_shows_the_expected_signature(env):
    content, _ = one(env, ToolCall("add", {"amount": "ten"}))
    assert content.endswith("Expected: add(amount: integer).")


def test_structured_results_are_json(env):
    content, _ = one(env, ToolCall("report"))
    assert json.loads(content) == {"value": 1, "items": [1, 2]}


def test_calls_run_in_order_and_failures_are_counted(env):
    result = env.step(
        [ToolCall("add", {"amount": 1}), ToolCall("nope"), ToolCall("add", {"amount": 1})]
    )
    assert [m["content"] for m in result.messages][0::2] == ["2", "3"]
    assert result.info["tool_calls"] == 3
    assert result.info["tool_failures"] == 1


def test_calls_after_done_are_errors(env):
    result = env.step([ToolCall("finish"), ToolCall("add", {"amount": 1})])
    assert result.terminated
    assert result.messages[1]["content"].startswith("Error: the episode is over")
    assert result.info["failures"][0]["kind"] == "episode_over"
    assert env.unwrapped.value == 1


def test_max_turns_truncates(env):
    for _ in range(3):
        result = env.step(ToolCall("add", {"amount": 1}))
    assert result.truncated and not result.terminated
    content, info = one(env, ToolCall("add", {"amount": 1}))
    assert "turn limit" in content
    assert info["failures"][0]["kind"] == "episode_over"


def test_reset_starts_a_clean_episode(env):
    env.step(ToolCall("finish"))
    env.reset(start=5)
    assert (env.done, env.reward, env.turn) == (False, 0.0, 0)
    assert one(env, ToolCall("add", {"amount": 1}))[0] == "6"


def test_reset_ignores_columns_it_does_not_take():
    env = toolgym.as_environment(Counter())
    env.reset(start=2, prompt=[{"role": "user", "content": "hi"}], seed=1)
    assert env.unwrapped.value == 2


def test_step_before_reset_is_a_programming_error():
    with pytest.raises(RuntimeError, match="reset"):
        toolgym.as_environment(Counter()).step(ToolCall("add", {"amount": 1}))


def test_async_tool_from_step_and_astep(env):
    assert one(env, ToolCall("slow_add", {"amount": 1}))[0] == "2"
    result = asyncio.run(env.astep(ToolCall("slow_add", {"amount": 1})))
    assert result.messages[0]["content"] == "3"


def test_async_tool_from_step_inside_a_running_loop(env):
    async def inside() -> str:
        return env.step(ToolCall("slow_add", {"amount": 1})).messages[0]["content"]

    assert asyncio.run(inside()) == "2"


def test_astep_runs_sync_tools_off_the_event_loop():
    class Sleepy(toolgym.Environment):
        def nap(self) -> str:
            """Sleep a little (blocking)."""
            time.sleep(0.3)
            return "rested"

    envs = [toolgym.as_environment(Sleepy()) for _ in range(4)]
    for env in envs:
        env.reset()

    async def all_at_once():
        return await asyncio.gather(*(env.astep(ToolCall("nap")) for env in envs))

    started = time.perf_counter()
    results = asyncio.run(all_at_once())
    elapsed = time.perf_counter() - started
    assert [r.messages[0]["content"] for r in results] == ["rested"] * 4
    assert elapsed < 1.0, f"four 0.3 s tools took {elapsed:.2f} s: they ran one after another"


call_dicts = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(
            st.sampled_from(["add", "finish", "crash", "report", "x"]),
            st.text(max_size=8),
            st.integers(),
        ),
        "arguments": st.one_of(
            st.none(),
            st.text(max_size=30),
            st.dictionaries(
                st.text(max_size=8),
                st.one_of(st.integers(), st.text(max_size=8), st.none()),
                max_size=3,
            ),
            st.lists(st.integers(), max_size=3),
        ),
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(call_dicts, max_size=4))
def test_nothing_the_model_sends_raises(calls):
    env = toolgym.as_environment(Counter())
    env.reset()
    result = env.step(calls)
    assert len(result.messages) == len(calls)
    assert all(m["role"] == "tool" and isinstance(m["content"], str) for m in result.messages)
    assert result.info["tool_failures"] == sum(not r.ok for r in result.results)


class Dice(toolgym.Environment):
    """Seeded state, a limit set by reset, and a copy that must step on its own."""

    def reset(self, turns: int = 2) -> str | None:
        self.max_turns = turns
        self.rolls = [self.rng.randint(1, 6) for _ in range(3)]
        return str(self.rolls)

    def roll(self) -> int:
        """Roll the die."""
        return self.rng.randint(1, 6)


def test_max_turns_set_by_reset_truncates():
    env = toolgym.as_environment(Dice())
    env.reset(turns=2, seed=0)
    results = [env.step(ToolCall("roll")) for _ in range(3)]
    assert [r.truncated for r in results] == [False, True, True]
    assert results[2].info["failures"][0]["kind"] == "episode_over"
    env.reset(turns=3, seed=0)
    assert [env.step(ToolCall("roll")).truncated for _ in range(3)] == [False, False, True]


def test_copies_and_pickles_step_on_their_own():
    import copy
    import pickle

    env = toolgym.as_environment(Dice())
    env.reset(turns=5, seed=3)
    env.step(ToolCall("roll"))
    for twin in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        assert twin.turn == 1 and twin.unwrapped.rolls == env.unwrapped.rolls
        assert twin.unwrapped is not env.unwrapped
        twin.step(ToolCall("roll"))
        assert (twin.turn, env.turn) == (2, 1)  # the copy counted its own turn
    fresh = toolgym.as_environment(copy.copy(env.unwrapped))  # an instance copied: a new Stepper
    with pytest.raises(RuntimeError, match="reset"):
        fresh.step(ToolCall("roll"))


def test_turn_can_be_set_from_a_tool_or_reset():
    env = toolgym.as_environment(Dice())
    env.reset(seed=0)
    env.turn = 1
    assert env.step(ToolCall("roll")).truncated  # 2 turns: this was the last


def test_a_plain_class_done_flag_is_cleared_by_reset():
    class Coin:
        def reset(self, **kwargs):
            return "flip"

        def flip(self) -> str:
            """Flip once; the game ends."""
            self.done = True
            return "heads"

    env = toolgym.as_environment(Coin())
    for _ in range(2):
        env.reset()
        assert env.step(ToolCall("flip")).messages[0]["content"] == "heads"


def test_an_async_reset_is_awaited():
    class Later(toolgym.Environment):
        async def reset(self) -> str:
            await asyncio.sleep(0)
            return "ready"

        def act(self) -> str:
            """Act."""
            return "done"

    assert toolgym.as_environment(Later()).reset(seed=0) == "ready"


class Quiz(toolgym.Environment):
    def reset(self, target: int = 42) -> str:
        self.target = target
        return "Find the number."

    def hint(self) -> str:
        """A hint about the number."""
        return "It is even."

    @toolgym.ends_episode
    def submit(self, answer: int) -> str:
        """Submit the final answer.

        Args:
            answer: The number you found.
        """
        self.reward = float(answer == self.target)
        return "recorded"


def test_a_tool_marked_as_the_answer_ends_the_episode_once_it_succeeds():
    env = toolgym.as_environment(Quiz())
    env.reset()
    invalid = env.step(ToolCall("submit", {"answer": "many"}))  # an error is not an answer
    assert not invalid.terminated and invalid.info["answered"] is False
    step = env.step(
        [ToolCall("hint", {}), ToolCall("submit", {"answer": 42}), ToolCall("hint", {})]
    )
    assert step.terminated and step.info["answered"] and env.get_reward() == 1.0
    assert [m["content"] for m in step.messages][:2] == ["It is even.", "recorded"]
    assert "the episode is over" in step.messages[2]["content"]
    env.reset()
    assert not env.step(ToolCall("hint", {})).terminated  # a new episode starts unanswered


def test_an_agent_that_answers_through_the_tool_finishes_without_a_text_turn():
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    call = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'
    replies = [
        call.format(name="hint", arguments="{}"),
        call.format(name="submit", arguments='{"answer": 42}'),
    ]
    agent = scripted_agent(tiny_tokenizer(), replies)
    (trajectory,) = agent.run([Quiz()], [{"prompt": "Play."}])
    assert trajectory.status == "finished" and trajectory.reward == 1.0
    assert trajectory.metrics["turns"] == 2
    last = trajectory.messages[-1]
    assert (last["role"], last["name"], last["content"]) == ("tool", "submit", "recorded")
