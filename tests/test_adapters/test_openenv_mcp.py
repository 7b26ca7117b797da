"""OpenEnv's MCP-style environments through `toolgym.openenv`: a real openenv-core server
(`create_fastapi_app` over an `MCPEnvironment` with FastMCP tools, as OpenEnv's own tool
environments are served) on loopback, each of its MCP tools a toolgym tool, each call a
`call_tool` step."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import pytest
from helpers import one_grpo_step, scripted_agent

import toolgym

pytest.importorskip("openenv.core")
pytest.importorskip("fastmcp")

from fastmcp import FastMCP
from fastmcp.utilities.types import Image
from openenv.core.env_server import Observation, State, create_fastapi_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from test_openenv import uvicorn_thread


class NotesEnvironment(MCPEnvironment):
    """Notes kept per session through MCP tools; `submit(answer)` pays 1 for the reset's
    secret and ends the episode. `hint` is a simulation-mode tool (openenv-core's mode tools);
    a reset with `mode="production"` takes it away."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        server = FastMCP("notes")
        self.notes: list[str] = []
        self.secret = "crane"

        @server.tool
        def write(text: str) -> str:
            """Write a note."""
            self.notes.append(text)
            return f"{len(self.notes)} notes"

        @server.tool
        def read(index: int) -> str:
            """Read the note at an index."""
            return self.notes[index]

        @server.tool
        def count() -> dict:
            """How many notes there are."""
            return {"count": len(self.notes)}

        @server.tool
        def picture() -> Image:
            """A picture of the notes."""
            return Image(data=b"\x89PNG\r\n\x1a\n", format="png")

        @server.tool
        def submit(answer: str) -> str:
            """Submit the secret word."""
            return "Correct!" if answer == self.secret else "Wrong."

        super().__init__(server)
        self._mode = "simulation"

        @self.tool(mode="simulation")
        def hint() -> str:
            """The secret's first letter."""
            return self.secret[0]

        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, secret: str = "crane", mode: str = "simulation"):
        self.notes, self.secret, self._mode = [], secret, mode
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation()

    async def step_async(self, action, timeout_s=None, **kwargs: Any):
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            observation.done = observation.error is None
            observation.reward = float(action.arguments.get("answer") == self.secret)
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs: Any):
        raise ValueError(f"only MCP actions are taken, not {type(action).__name__}")

    @property
    def state(self) -> State:
        return self._state


class NotesCallAction(CallToolAction):
    """A subclass of CallToolAction (as some OpenEnv environments declare): openenv-core then
    refuses `list_tools` through `/step`, and the tools are listed through `/mcp`."""


@pytest.fixture(scope="module")
def url():
    app = create_fastapi_app(
        NotesEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=16
    )
    with uvicorn_thread(app) as address:
        yield address


def call(name: str, **arguments) -> toolgym.ToolCall:
    return toolgym.ToolCall(name, arguments)


def content(step) -> str:
    (message,) = step.messages
    return message["content"]


def test_each_mcp_tool_of_an_openenv_server_is_a_tool_and_each_call_a_step(url):
    toolgym.register("test/Notes-v0", toolgym.openenv(url))
    with toolgym.make("test/Notes-v0") as env:
        tools = {tool["function"]["name"]: tool["function"] for tool in env.tools}
        assert list(tools) == ["write", "read", "count", "picture", "submit", "hint"]
        assert tools["read"]["description"] == "Read the note at an index."
        assert tools["read"]["parameters"]["required"] == ["index"]
        assert tools["read"]["parameters"]["properties"]["index"]["type"] == "integer"
        assert env.reset(secret="slate") is None  # the observation has no fields
        assert content(env.step(call("write", text="first"))) == "1 notes"
        assert content(env.step(call("read", index="0"))) == "first"  # coerced, then sent
        assert content(env.step(call("count"))) == '{"count":1}'  # the tool's text block
        assert content(env.step(call("hint"))) == "s"  # a mode tool, listed by list_tools
        assert env.get_reward() is None and not env.done
        wrong = env.step(call("submit", answer="crane"))
        assert content(wrong) == "Wrong." and wrong.terminated and env.get_reward() == 0.0
        env.reset(secret="slate")
        won = env.step(call("submit", answer="slate"))
        assert content(won) == "Correct!" and won.reward == 1.0 and env.done


def test_the_servers_errors_are_named_failures_and_an_image_is_carried(url):
    with toolgym.openenv(url)() as env:
        env.reset(mode="production")
        missing = env.step(call("read"))  # checked against the listed schema, never sent
        assert missing.results[0].failure == "invalid_arguments"
        raised = env.step(call("read", index=5))
        assert raised.results[0].failure == "tool_error"
        assert content(raised) == (
            "Error (execution_error): Error calling tool 'read': list index out of range"
        )
        gone = env.step(call("hint"))  # listed, but not in this episode's mode
        assert gone.results[0].failure == "unknown_tool"
        assert (
            content(gone) == "Error (tool_not_found): Tool 'hint' not available in production mode"
        )
        assert not env.done
        image = env.step(call("picture"))  # carried for models that see images
        assert image.results[0].ok and not image.terminated
        (block,) = image.messages[0]["content_blocks"]
        assert block["image"].startswith("data:image/png;base64,iVBOR")


def test_sessions_are_apart_and_astep_goes_through_the_session(url):
    factory = toolgym.openenv(url)

    async def play(note: str) -> list[str]:
        with factory() as env:
            await asyncio.to_thread(env.reset)
            written = await env.astep([call("write", text=note), call("write", text=note)])
            read = await env.astep(call("read", index=1))
            return [m["content"] for m in written.messages + read.messages]

    async def both():
        return await asyncio.gather(play("a"), play("b"))

    assert asyncio.run(both()) == [["1 notes", "2 notes", "a"], ["1 notes", "2 notes", "b"]]


def test_an_action_subclass_is_listed_through_mcp_and_tools_and_mcp_choose():
    app = create_fastapi_app(
        NotesEnvironment, NotesCallAction, CallToolObservation, max_concurrent_envs=4
    )
    with uvicorn_thread(app) as address:
        with toolgym.openenv(address, tools=["write", "count"])() as env:
            assert [tool["function"]["name"] for tool in env.tools] == ["write", "count"]
            env.reset()
            assert content(env.step(call("write", text="x"))) == "1 notes"
            assert env.step(call("read", index=0)).results[0].failure == "unknown_tool"
        with pytest.raises(RuntimeError, match=r"has no tool 'erase'; it lists write, read"):
            toolgym.openenv(address, tools=["erase"]).tool_table()
        with toolgym.openenv(address, mcp=False)() as env:  # the action as one tool
            (tool,) = env.tools
            assert tool["function"]["name"] == "notes_call"
            assert {"tool_name", "arguments"} <= set(tool["function"]["parameters"]["properties"])


def test_a_scripted_agent_and_one_grpo_step_against_an_mcp_style_openenv_server(url, tmp_path):
    from toolgym.testing import tiny_tokenizer

    reply = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call><|im_end|>'
    replies = [reply % ("hint", "{}"), reply % ("submit", '{"answer": "slate"}')]
    agent = scripted_agent(tiny_tokenizer(), replies, max_turns=3)
    with toolgym.openenv(url)() as env:
        (trajectory,) = agent.run([env], [{"prompt": "Find the word.", "secret": "slate"}])
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["s", "Correct!"]
    assert trajectory.status == "env_done" and trajectory.reward == 1.0

    env = toolgym.openenv(url, dataset=[{"prompt": "Find the word.", "secret": "slate"}])
    metrics = one_grpo_step(env, env.dataset_builder(2, seed=0), tmp_path)
    assert metrics["statuses"].get("env_error", 0) == 0 and "loss" in metrics
