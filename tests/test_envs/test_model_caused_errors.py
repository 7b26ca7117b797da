"""Every error the model's text causes is the model's (issue 43 item 5): an exception an
environment raises while it handles one of the model's calls stays in the loss, unless the
environment marks it its own (`toolgym.EnvironmentBug`); the built-in environments never raise
on the model's input. Local, process and docker backends."""

from __future__ import annotations

import os
import shutil

import pytest
from helpers import ids, inline_agent
from model_caused_envs import Fragile, FragileChat

import toolgym
from toolgym.adapters.mcp import MCPServerGone
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.algorithms.advantages import group_advantages
from toolgym.builtin_envs.python_lines import PythonLines
from toolgym.envs.calls import (
    EpisodeFailure,
    InfrastructureFailure,
    ModelCausedError,
    ModelFailure,
)
from toolgym.envs.stepping import failure_status
from toolgym.sandbox import sandboxed
from toolgym.sandbox.ray_backend import ActorLost
from toolgym.sandbox.remote import RemoteError, SandboxError, SandboxTimeout, model_caused
from toolgym.testing import tiny_tokenizer

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"


def _docker_ready() -> bool:
    from toolgym.sandbox.docker import docker_ready

    return docker_ready()


LOCAL_AND_PROCESS = [
    "local",
    pytest.param(
        "process",
        marks=pytest.mark.skipif(
            not REQUIRED and shutil.which("bwrap") is None, reason="bubblewrap is not installed"
        ),
    ),
]
BACKENDS = [
    *LOCAL_AND_PROCESS,
    pytest.param(
        "docker",
        marks=[
            pytest.mark.docker,
            pytest.mark.skipif(
                not REQUIRED and not _docker_ready(), reason="no Docker daemon or sandbox image"
            ),
        ],
    ),
]

DEEP_REPR = "-[" * 600 + "1" + "]" * 600
"""A repr that makes `ast.literal_eval` raise MemoryError (the parser's stack), 1,801
characters: within PythonLines' output limit."""


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _in_the_loss(trajectories) -> list[bool]:
    rewards = [t.reward for t in trajectories]
    _, used = group_advantages(rewards, [not t.failed for t in trajectories], len(rewards))
    return used.tolist()


@pytest.mark.parametrize("where", BACKENDS)
def test_python_lines_answers_what_crashed_its_own_code(where):
    """The three inputs that raised inside PythonLines (IndexError on an empty stderr, twice;
    MemoryError from `ast.literal_eval` of a deep repr) are now answers the model reads."""
    env = _env(PythonLines, where)
    try:
        env.reset(seed=0, task="t", answer="1")
        env.inline_step("import sys\n")
        step = env.inline_step("print(file=sys.stderr)\n")
        assert (step.observation, step.failed) == (None, False)
        step = env.inline_step("submit(print(' ', file=sys.stderr))\n")
        assert step.observation == "submit failed: no value\n" and step.failed
        env.inline_step("class Deep:\n")
        env.inline_step(f"    def __repr__(self): return {DEEP_REPR!r}\n")
        env.inline_step("\n")
        step = env.inline_step("submit(Deep())\n")
        assert step.done and step.observation == f"submitted {DEEP_REPR}\n"
        assert env.get_reward() == 0.0
    finally:
        env.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_an_exception_on_the_model_s_text_is_the_model_s_failure(tokenizer, where):
    """Through the agent: an inline_step and a final_answer that raise on the model's text end
    `tool_crash` (in the loss, with `model_failure_reward`); the same code raising
    `EnvironmentBug` ends `env_error` (left out). Before: all four ended `env_error`."""
    outcomes = {}
    inline = _env(Fragile, where)
    chat = _env(FragileChat, where)
    try:
        limits = {"max_turns": 2, "model_failure_reward": -1.0}
        row = {"prompt": "go"}
        for route, text in (("inline", "  \n"), ("inline bug", "bug\n")):
            (outcomes[route],) = inline_agent(tokenizer, [text], **limits).run([inline], [row])
        agent = _chat_agent(tokenizer, " <|im_end|>", **limits)
        (outcomes["final answer"],) = agent.run([chat], [row])
        agent = _chat_agent(tokenizer, "bug<|im_end|>", **limits)
        (outcomes["final answer bug"],) = agent.run([chat], [row])
    finally:
        inline.close()
        chat.close()
    for route, played in outcomes.items():
        print(route, played.status, played.reward, played.error)
    assert {route: t.status for route, t in outcomes.items()} == {
        "inline": "tool_crash",
        "inline bug": "env_error",
        "final answer": "tool_crash",
        "final answer bug": "env_error",
    }
    assert "IndexError" in outcomes["inline"].error
    assert "the grader's data file is missing" in outcomes["inline bug"].error
    assert outcomes["inline"].reward == outcomes["final answer"].reward == -1.0
    used = dict(zip(outcomes, _in_the_loss(list(outcomes.values())), strict=True))
    assert used == {route: "bug" not in route for route in outcomes}


@pytest.mark.parametrize("where", LOCAL_AND_PROCESS)
def test_a_tool_s_exception_is_read_by_the_model_and_a_marked_bug_ends_env_error(where):
    env = _env(FragileChat, where)
    try:
        env.reset(seed=0)
        step = env.step(toolgym.ToolCall("check", {"text": " "}))
        assert step.results[0].failure == "tool_exception" and not step.terminated
        assert "IndexError" in step.messages[0]["content"]
        step = env.step(toolgym.ToolCall("check", {"text": "a bug"}))
        assert step.info["ended"] == "env_error" and step.terminated
        assert "the grader's data file is missing" in step.info["error"]
    finally:
        env.close()


def test_one_rule_decides_whose_a_failure_is():
    assert failure_status(ModelCausedError("x")) == "tool_crash"
    assert failure_status(toolgym.EnvironmentBug("x")) == "env_error"
    assert failure_status(IndexError("an unmarked error outside the model's calls")) == "env_error"

    class Both(toolgym.EnvironmentBug, ModelFailure):
        pass

    assert failure_status(Both("x")) == "env_error"  # the environment's word wins
    assert failure_status(ModelFailure("x")) == "tool_crash"
    assert failure_status(MCPServerGone("x")) == "tool_crash"
    assert failure_status(InfrastructureFailure("x")) == "env_error"
    assert failure_status(EpisodeFailure("unclassified")) == "env_error"

    class ModelTimeout(ModelFailure, TimeoutError):
        pass

    assert failure_status(ModelTimeout("x")) == "tool_timeout"


def test_a_sandbox_failure_during_the_model_s_call_is_typed_as_the_model_s():
    """`model_caused` keeps the kind of the sandbox's failure and adds the model's type."""
    lost = model_caused(SandboxError("worker died during call"))
    assert isinstance(lost, SandboxError) and failure_status(lost) == "tool_crash"
    late = model_caused(SandboxTimeout("call took over its time limit"))
    assert isinstance(late, SandboxTimeout) and failure_status(late) == "tool_timeout"
    remote = model_caused(RemoteError("call", {"type": "ModelCausedError", "message": "m"}))
    assert isinstance(remote, RemoteError) and remote.type == "ModelCausedError"
    assert failure_status(remote) == "tool_crash"
    assert failure_status(SandboxError("a worker that never started")) == "env_error"
    assert failure_status(ActorLost("the node died")) == "env_error"


def _env(cls, where):
    return toolgym.as_environment(cls()) if where == "local" else sandboxed(cls, where=where)


def _chat_agent(tokenizer, text: str, **limits) -> Agent:
    engine = ScriptedEngine([ids(tokenizer, text)])
    return Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(**limits))
