"""Time limits are decided and enforced in one place (`toolgym.envs.time_limits`): each call's
limit within its turn's, the typed failure past it (the model's for its calls, the
environment's for reading the outcome), and a failure the work typed itself left as it is."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from helpers import ids

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.envs.calls import EnvironmentFailure, ModelFailure
from toolgym.envs.stepping import failure_status
from toolgym.envs.time_limits import CallTimedOut, ReadTimedOut, TimeLimits, within
from toolgym.sandbox.remote import SandboxTimeout, WorkerTimedOutOnModel
from toolgym.testing import tiny_tokenizer


def test_a_hook_gets_the_smaller_limit_and_a_turn_a_backstop_beyond_its_own():
    assert TimeLimits(call=3.0, turn=10.0).one_call == 3.0
    assert TimeLimits(call=30.0, turn=2.0).one_call == 2.0
    assert TimeLimits(call=None, turn=2.0).one_call == 2.0
    assert TimeLimits().one_call is None and TimeLimits().backstop is None
    assert TimeLimits(turn=2.0).backstop == 4.0 and TimeLimits(turn=30.0).backstop == 35.0
    assert AgentLimits(tool_timeout=7, tool_call_timeout=3).time_limits == TimeLimits(3, 7)


def test_each_call_gets_its_own_limit_until_the_turn_has_less_left():
    clock = TimeLimits(call=5.0, turn=60.0).turn_clock()
    assert clock.next_call() == (5.0, "took over 5 s, the time limit of one tool call")
    clock = TimeLimits(call=5.0, turn=2.0).turn_clock()
    left, why = clock.next_call()
    assert 0 < left <= 2.0 and why.startswith("ran past the turn's time limit")
    spent = TimeLimits(call=5.0, turn=0.05).turn_clock()
    time.sleep(0.1)
    assert spent.next_call()[0] == 0.0  # spent: the next call does not start
    assert TimeLimits().turn_clock().next_call() == (None, "")


def test_past_its_limit_a_call_is_the_model_s_and_a_read_the_environment_s():
    with pytest.raises(CallTimedOut, match=r"sleep took over 0\.05 s") as raised:
        asyncio.run(within(asyncio.sleep(5), 0.05, "sleep"))
    assert isinstance(raised.value, ModelFailure) and failure_status(raised.value) == "tool_timeout"
    with pytest.raises(ReadTimedOut, match=r"get_reward took over 0\.05 s") as raised:
        asyncio.run(within(asyncio.sleep(5), 0.05, "get_reward", model_caused=False))
    assert isinstance(raised.value, EnvironmentFailure)
    assert failure_status(raised.value) == "env_error"
    assert asyncio.run(within(asyncio.sleep(0, result=7), None, "no limit")) == 7


def test_a_timeout_the_work_typed_itself_passes_through_unchanged():
    async def sandbox_says(error: BaseException) -> None:
        raise error

    for error, status in (
        (WorkerTimedOutOnModel("the worker ran past 1 s"), "tool_timeout"),
        (SandboxTimeout("a worker that never answered"), "env_error"),
    ):
        with pytest.raises(type(error)) as raised:
            asyncio.run(within(sandbox_says(error), 5.0, "call"))
        assert raised.value is error and failure_status(error) == status


class SlowGrader(toolgym.Environment):
    """Answers at once; its grader hangs."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def reset(self, **row) -> str:
        return "Say anything."

    def get_reward(self) -> float:
        self.release.wait(5)
        return 1.0


def test_a_reward_read_past_the_limit_is_the_environment_s_failure_named_by_the_read():
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([ids(tokenizer, "done<|im_end|>")])
    agent = Agent(engine, tokenizer, limits=AgentLimits(max_turns=1, tool_timeout=0.2))
    env = SlowGrader()
    try:
        (trajectory,) = agent.run([toolgym.as_environment(env)], [{"prompt": "go"}])
    finally:
        env.release.set()
    assert trajectory.status == "env_error" and trajectory.reward == 0.0
    assert trajectory.error == "get_reward took over 0.2 s"
