"""verifiers environments in toolgym and toolgym environments in verifiers (issue 47 item 4),
with verifiers 0.1.14 from PyPI, unchanged.

One way, a `vf.ToolEnv` and a `vf.MultiTurnEnv` with its own `env_response` run their own
loops against toolgym's endpoint: the reward is their rubric's, the trajectory the exact
tokens (tool results masked), an environment that raises ends `env_error`. The other way,
Wordle runs in verifiers' own `run_rollout` and scores what toolgym's own loop scores for the
same replies."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from helpers import ids
from verifiers_site import verifiers_on_path

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.agents.endpoint import Endpoint
from toolgym.testing import tiny_tokenizer

CALL = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def vf():
    with verifiers_on_path():
        import verifiers

        yield verifiers


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def contains_answer(completion, answer, **_) -> float:
    """1 where the last message holds the answer."""
    last = completion[-1]
    text = last["content"] if isinstance(last, dict) else last.content
    return float(str(answer) in (text or ""))


def sums(vf):
    from datasets import Dataset

    data = Dataset.from_list(
        [{"question": "What is 2+3?", "answer": "5"}, {"question": "What is 4+4?", "answer": "8"}]
    )
    rubric = vf.Rubric(funcs=[contains_answer])
    return vf.ToolEnv(tools=[add], dataset=data, rubric=rubric, max_turns=4)


def agent_for(replies: list[str], **limits) -> Agent:
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([ids(tokenizer, r) for r in replies], context_length=1 << 15)
    limits = AgentLimits(**{"max_turns": 6, **limits})
    return Agent(engine, tokenizer, parser="hermes", limits=limits)


@pytest.mark.parametrize(("final", "reward"), [("It is 5.", 1.0), ("It is 6.", 0.0)])
def test_a_verifiers_tool_env_plays_its_own_loop_through_toolgym(vf, final, reward):
    from toolgym.agents.verifiers_envs import VerifiersEpisode, verifiers_rollout, verifiers_rows

    env = sums(vf)
    rows = verifiers_rows(env)
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 2+3?"}]
    agent = agent_for([CALL % ("add", '{"a": 2, "b": 3}'), final + "<|im_end|>"])
    (trajectory,) = agent.run([VerifiersEpisode()], rows[:1], rollout_fn=verifiers_rollout(env))
    assert trajectory.status == "finished" and trajectory.reward == reward
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[2]["content"] == "5"  # verifiers ran the tool itself
    metrics = trajectory.env_metrics
    assert metrics["vf/add_calls"] == 1.0 and metrics["vf/contains_answer"] == reward
    (sample,) = trajectory.samples  # verifiers sends the history back: one joined sequence
    sampled = [t for t, m in zip(sample.completion_ids, sample.loss_mask, strict=True) if m]
    unsampled = [t for t, m in zip(sample.completion_ids, sample.loss_mask, strict=True) if not m]
    decode = agent.tokenizer.decode
    assert decode(sampled) == CALL % ("add", '{"a": 2, "b": 3}') + final + "<|im_end|>"
    assert "<tool_response>\n5\n</tool_response>" in decode(unsampled)  # the tool's: masked


def test_a_verifiers_multiturn_env_keeps_its_own_env_response(vf):
    """A game written for verifiers (its `env_response` answers higher / lower, its stop
    condition ends it): toolgym plays it as it is."""
    from datasets import Dataset

    from toolgym.agents.verifiers_envs import VerifiersEpisode, verifiers_rollout, verifiers_rows

    class HigherLower(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            guess = int(re.findall(r"\d+", messages[-1].content)[-1])
            state["solved"] = guess == int(state["answer"])
            hint = (
                "right"
                if state["solved"]
                else ("higher" if guess < int(state["answer"]) else "lower")
            )
            return [vf.UserMessage(content=hint)]

        @vf.stop
        async def solved(self, state) -> bool:
            return bool(state.get("solved"))

    def solved(state, **_) -> float:
        return float(bool(state.get("solved")))

    data = Dataset.from_list([{"question": "Guess my number (1-10).", "answer": "7"}])
    env = HigherLower(dataset=data, rubric=vf.Rubric(funcs=[solved]), max_turns=5)
    agent = agent_for(["5<|im_end|>", "8<|im_end|>", "7<|im_end|>"])
    rows = verifiers_rows(env)
    (trajectory,) = agent.run([VerifiersEpisode()], rows, rollout_fn=verifiers_rollout(env))
    assert trajectory.reward == 1.0, trajectory.error
    users = [m["content"] for m in trajectory.messages if m["role"] == "user"][1:]
    # verifiers checks its stop conditions before asking for the next prompt, so the hint
    # that sets `solved` still reaches the model, which answers once more, as in verifiers
    assert users == ["higher", "lower", "right"]


def test_a_verifiers_env_that_raises_ends_the_episode_env_error(vf):
    from datasets import Dataset

    from toolgym.agents.verifiers_envs import VerifiersEpisode, verifiers_rollout, verifiers_rows

    class Broken(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            raise RuntimeError("the environment's own bug")

    data = Dataset.from_list([{"question": "Say hi.", "answer": "hi"}])
    env = Broken(dataset=data, rubric=vf.Rubric(funcs=[contains_answer]), max_turns=3)
    agent = agent_for(["hi<|im_end|>"])
    rows = verifiers_rows(env)
    (trajectory,) = agent.run([VerifiersEpisode()], rows, rollout_fn=verifiers_rollout(env))
    assert trajectory.status == "env_error" and "own bug" in trajectory.error
    assert trajectory.reward is None or trajectory.reward == 0.0


def test_a_toolgym_environment_plays_in_verifiers_own_loop(vf):
    """Wordle as a `vf.MultiTurnEnv`: verifiers' `run_rollout` against toolgym's endpoint over
    a scripted model scores what toolgym's own `Agent.run` scores for the same replies; a call
    to a tool that does not exist is answered with toolgym's error and the game goes on."""
    from openai import AsyncOpenAI
    from verifiers.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

    from toolgym.agents.verifiers_envs import verifiers_environment, verifiers_rows

    rows = list(toolgym.spec("Wordle-v0").dataset(2, seed=0))
    env = verifiers_environment("Wordle-v0", rows, max_turns=8)
    tokenizer = tiny_tokenizer()
    for row, vf_row in zip(rows, verifiers_rows(env), strict=True):
        replies = [
            CALL % ("hint", "{}"),  # no such tool: toolgym's error, and the game goes on
            CALL % ("guess", '{"word": "crane"}'),
            CALL % ("guess", json.dumps({"word": row["answer"]})),
        ]
        engine = ScriptedEngine([ids(tokenizer, r) for r in replies], context_length=1 << 15)

        async def play(engine=engine, vf_row=vf_row):
            with Endpoint(engine, tokenizer, parser="hermes", open_sessions=True) as endpoint:
                openai = AsyncOpenAI(base_url=endpoint.base_url, api_key="s", max_retries=0)
                client = OpenAIChatCompletionsClient(openai)
                return await env.run_rollout(vf_row, client, "policy", {})

        output = asyncio.run(play())
        roles = [m["role"] if isinstance(m, dict) else m.role for m in output["completion"]]
        assert roles == ["assistant", "tool"] * 3 and output["error"] is None
        first_tool = output["completion"][1]
        text = first_tool["content"] if isinstance(first_tool, dict) else first_tool.content
        assert "unknown tool 'hint'" in text
        own = agent_for(replies, max_turns=8).run([toolgym.make("Wordle-v0")], [row])[0]
        assert output["reward"] == own.reward > 0
