"""A simulated user (issue 45 item 6): a model writes the user's turns of an episode through
`Environment.user_turn`, reading the conversation from the user's side; its failures are the
environment's, never the policy's."""

from __future__ import annotations

import asyncio

import pytest
from helpers import ids

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine, SimulatedUser
from toolgym.agents.chat_clients import ChatClientError
from toolgym.testing import tiny_tokenizer


class Scripted:
    """A user model whose messages are listed; records what it was shown."""

    def __init__(self, *messages: str, delay: float = 0.0) -> None:
        self.messages, self.delay, self.name, self.seen = list(messages), delay, "script", []

    async def complete(self, messages):
        self.seen.append(messages)
        await asyncio.sleep(self.delay)
        return self.messages.pop(0)


def test_the_user_reads_the_conversation_from_its_side_and_stops_when_satisfied():
    client = Scripted("I need a table for two.", "Tonight at eight, please.", "[done]")
    user = SimulatedUser(client, "You want a table for two tonight.")
    assert user.opening() == "I need a table for two."
    assert user.reply("For how many, and when?") == "Tonight at eight, please."
    assert user.reply("Booked for 20:00.") is None and user.satisfied
    assert user.reply("anything else?") is None  # over: no more calls
    last = client.seen[-1]
    assert last[0]["role"] == "system" and "You want a table" in last[0]["content"]
    assert [m["role"] for m in last[1:]] == ["assistant", "user", "assistant", "user"]
    assert last[-1]["content"] == "Booked for 20:00."


def test_the_user_stops_after_max_turns_and_a_given_opening_is_not_written():
    client = Scripted("more?", "more?")
    user = SimulatedUser(client, "x", first_message="Hello.", max_turns=1)
    assert user.opening() == "Hello." and client.seen == []
    assert user.reply("hi") == "more?" and user.reply("and?") is None


class Booking(toolgym.Environment):
    """A user who wants a booking; the episode ends when the user is satisfied."""

    client = None

    def reset(self, **row) -> str:
        self.user = SimulatedUser(self.client, "You want a table for two.", max_turns=3)
        return self.user.opening()

    def user_turn(self, answer: str) -> str | None:
        return self.user.reply(answer)

    def get_reward(self) -> float:
        return 1.0 if self.user.satisfied else 0.0


def play(client, answers: list[str]):
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([ids(tokenizer, a + "<|im_end|>") for a in answers])
    agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(max_turns=6))
    env = Booking()
    env.client = client
    (trajectory,) = agent.run([toolgym.as_environment(env)], [{"prompt": []}])
    return trajectory


def test_an_episode_plays_the_simulated_user_s_turns():
    client = Scripted("A table, please.", "For two, at eight.", "[done]")
    trajectory = play(client, ["How many people?", "Booked: two at eight."])
    users = [m["content"] for m in trajectory.messages if m["role"] == "user"]
    assert users == ["A table, please.", "For two, at eight."]
    assert trajectory.status == "finished" and trajectory.reward == 1.0
    assert client.seen[-1][-1] == {"role": "user", "content": "Booked: two at eight."}


@pytest.mark.parametrize(
    ("client", "why"),
    [
        (Scripted("Hi.", "", "x"), "wrote nothing"),
        (Scripted("Hi.", "late", delay=0.0), "took over"),
    ],
    ids=["empty", "timeout"],
)
def test_a_failing_user_model_is_the_environment_s_not_the_policy_s(client, why, monkeypatch):
    if why == "took over":
        original = client.complete

        async def slow(messages):
            if len(client.seen) >= 1:
                await asyncio.sleep(5)
            return await original(messages)

        monkeypatch.setattr(client, "complete", slow)
        monkeypatch.setattr(SimulatedUser, "__init__", _short_timeout(SimulatedUser.__init__))
    trajectory = play(client, ["How many?", "ok"])
    assert trajectory.status == "env_error" and why in trajectory.error, trajectory.error
    assert trajectory.failed  # out of the loss: the policy did not cause it


def _short_timeout(init):
    def patched(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "timeout": 0.2})

    return patched


def test_a_client_error_is_typed_the_environment_s():
    assert issubclass(ChatClientError, toolgym.envs.calls.EnvironmentFailure)
