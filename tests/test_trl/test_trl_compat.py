"""A class written for TRL's `environment_factory` runs unchanged."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest

import toolgym
import toolgym.gym
from toolgym import ToolCall


class TRLStyleCounter:
    """The shape TRL documents: no base class, reset(**kwargs), public tool methods,
    tools raising on bad input, and an optional get_reward()."""

    def __init__(self):
        self.total = 0
        self.target = 0

    def reset(self, **kwargs) -> str | None:
        self.total = 0
        self.target = int(kwargs.get("target", 3))
        return f"Reach exactly {self.target}."

    def increment(self, step: int) -> str:
        """
        Increase the counter.

        Args:
            step: Amount to add; must be positive.

        Returns:
            The new total.
        """
        if step <= 0:
            raise ValueError("step must be positive")
        self.total += step
        return str(self.total)

    async def peek(self) -> str:
        """
        Look at the counter without changing it.
        """
        return str(self.total)

    def get_reward(self) -> float:
        return 1.0 if self.total == self.target else 0.0


def test_trl_style_class_runs_unchanged():
    env = toolgym.as_environment(TRLStyleCounter())
    assert (
        env.reset(target=5, prompt=[{"role": "user", "content": "go"}], seed=1)
        == "Reach exactly 5."
    )
    assert [t["function"]["name"] for t in env.tools] == ["increment", "peek"]
    result = env.step([ToolCall("increment", {"step": 2}), ToolCall("increment", '{"step": 3}')])
    assert [m["content"] for m in result.messages] == ["2", "5"]
    # arguments reach the tool as sent, as TRL passes them: "3" stays a string
    sent = env.step(ToolCall("increment", {"step": "3"})).messages[0]["content"]
    assert sent == str({"error": "'<=' not supported between instances of 'str' and 'int'"})
    # TRL reads the reward once, when the episode ends: no per-step change is reported
    assert result.reward == 0.0 and env.get_reward() == 1.0
    bad = env.step(ToolCall("increment", {"step": -1}))
    # as TRL shows a tool that raised (tests/test_trl/test_trl_parity.py checks it against TRL)
    assert bad.messages[0]["content"] == "{'error': 'step must be positive'}"
    assert bad.info["tool_failures"] == 1
    assert asyncio.run(env.astep(ToolCall("peek"))).messages[0]["content"] == "5"
    env.close()  # the plain class has no close(); nothing breaks


@pytest.fixture
def registered():
    from toolgym import registry

    toolgym.register("TRLCounter-v0", TRLStyleCounter)
    yield
    registry._registry.pop("TRLCounter-v0")
    gymnasium.registry.pop("toolgym/TRLCounter-v0")


@pytest.mark.usefixtures("registered")
def test_trl_style_class_through_the_registry_and_gymnasium():
    env = toolgym.make("TRLCounter-v0")
    assert isinstance(env, toolgym.Stepper)  # a plain class is stepped by a Stepper
    env.reset(target=1)
    assert env.step(ToolCall("increment", {"step": 1})).reward == 0.0  # read at the end
    assert env.get_reward() == 1.0
    gym_env = gymnasium.make("toolgym/TRLCounter-v0")
    obs, _ = gym_env.reset(seed=0, options={"target": 2})
    assert obs == "Reach exactly 2."
    obs, reward, *_ = gym_env.step(
        '<tool_call>{"name": "increment", "arguments": {"step": 2}}</tool_call>'
    )
    assert (obs, reward) == ("increment: 2", 0.0)
    # the final answer ends the episode: its reward, read once, comes with it
    assert gym_env.step("I reached 2.")[1:3] == (1.0, True)


def test_plain_class_done_attribute_ends_the_episode():
    class Game:
        def reset(self, **kwargs):
            self.done = False

        def win(self) -> str:
            """Win the game."""
            self.done = True
            return "won"

    env = toolgym.as_environment(Game())
    env.reset()
    assert env.step(ToolCall("win")).terminated
    assert env.step(ToolCall("win")).info["failures"][0]["kind"] == "episode_over"
    env.reset()
    assert not env.done
