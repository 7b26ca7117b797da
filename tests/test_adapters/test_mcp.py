"""MCP both ways, with the real `mcp` SDK on loopback: MCP servers (written here, and one from
PyPI that this project did not write) as toolgym environments, over stdio and streamable HTTP;
and `toolgym serve --protocol mcp` driven by the SDK's own client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import one_grpo_step

import toolgym
from toolgym.adapters.mcp import MCPEpisode

mcp_sdk = pytest.importorskip("mcp")

SERVER = textwrap.dedent(
    '''
    import os
    import sys

    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    app = MCPServer("counter", log_level="ERROR")
    state = {"count": 0, "target": 3}
    PICTURE = (  # a 4 x 4 red PNG
        "iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAFElEQVR4nGM8ISfHAANMDEgANwcANHYBDK9"
        "qubUAAAAASUVORK5CYII="
    )


    @app.tool()
    def start(target: int = 3) -> str:
        """Start counting towards a target."""
        state.update(count=0, target=target)
        return f"Count to {target} with increment."


    @app.tool()
    def increment(by: int = 1) -> int:
        """Add to the counter."""
        state["count"] += by
        return state["count"]


    @app.tool()
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        if b == 0:
            raise ToolError("cannot divide by zero")
        return a / b


    @app.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()


    @app.tool()
    def die() -> str:
        """Exit the server's process."""
        os._exit(3)


    @app.tool()
    def picture() -> list:
        """A picture of the counter."""
        from mcp.types import ImageContent, TextContent

        return [
            TextContent(type="text", text="the counter:"),
            ImageContent(type="image", data=PICTURE, mimeType="image/png"),
        ]


    @app.tool()
    def score() -> float:
        """1 if the counter reached its target."""
        return float(state["count"] == state["target"])


    if __name__ == "__main__":
        if len(sys.argv) > 1:
            app.run("streamable-http", port=int(sys.argv[1]))
        else:
            app.run()
    '''
)


@pytest.fixture(scope="module")
def server_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "counter_server.py"
    path.write_text(SERVER)
    return path


@pytest.fixture
def quiet():
    with open(os.devnull, "w") as sink:
        yield sink


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def http_server(command: list[str], port: int, path: str = "/mcp"):
    """Run `command` (an MCP server on `port`) until the block ends; its URL."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {process.stderr.read().decode()}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stderr.close()


def call(name: str, **arguments) -> toolgym.ToolCall:
    return toolgym.ToolCall(name, arguments)


def contents(result) -> list[str]:
    return [message["content"] for message in result.messages]


# -- MCP servers as environments ---------------------------------------------------------------


def test_a_stdio_server_is_an_environment_through_register_and_make(server_file, quiet):
    env = toolgym.mcp(
        [sys.executable, str(server_file)], reset_tool="start", reward_tool="score", errlog=quiet
    )
    toolgym.register("test/McpCounter-v0", env, max_turns=5)
    with toolgym.make("test/McpCounter-v0") as instance:
        names = [tool["function"]["name"] for tool in instance.tools]
        assert names == ["increment", "divide", "pid", "die", "picture"]  # start, score: ours
        schema = instance.tools[0]["function"]
        assert schema["description"] == "Add to the counter."
        assert schema["parameters"]["properties"]["by"]["type"] == "integer"
        assert instance.max_turns == 5

        assert instance.reset(seed=0, target=2) == "Count to 2 with increment."
        result = instance.step([call("increment"), call("increment", by="1")])  # "1" coerced
        assert contents(result) == ["1", "2"] and result.info["tool_failures"] == 0
        assert instance.get_reward() == 1.0


def test_errors_are_tool_failures_with_the_servers_text(server_file, quiet):
    with toolgym.mcp([sys.executable, str(server_file)], errlog=quiet)() as env:
        env.reset()
        result = env.step(
            [call("divide", a=1, b=0), call("divide", a=1), call("nope"), call("divide", a=6, b=3)]
        )
        failures = [failure["kind"] for failure in result.info["failures"]]
        assert failures == ["tool_error", "invalid_arguments", "unknown_tool"]
        assert contents(result)[0] == "Error executing tool divide: cannot divide by zero"
        assert "'b' is a required property" in contents(result)[1]
        assert "divide(a: number, b: number)" in contents(result)[1]
        assert contents(result)[3] == "2.0"
        assert env.get_reward() is None  # no reward source: the trainer's functions score it
        assert not result.terminated


def test_an_image_result_carries_the_image_for_models_that_see_it(server_file, quiet):
    """Text-only readers get a placeholder; the message's blocks hold the image itself."""
    with toolgym.mcp([sys.executable, str(server_file)], errlog=quiet)() as env:
        env.reset()
        (message,) = env.step(call("picture")).messages
        assert message["content"] == "the counter:\n[image image/png]"
        text, image = message["content_blocks"]
        assert text == {"type": "text", "text": "the counter:"}
        assert image["image"].startswith("data:image/png;base64,iVBOR")


def test_a_call_that_kills_the_server_ends_the_episode_and_the_next_one_starts_afresh(
    server_file, quiet
):
    with toolgym.mcp([sys.executable, str(server_file)], errlog=quiet)() as env:
        env.reset()
        result = env.step([call("die"), call("increment")])
        assert result.terminated and result.info["ended"] == "tool_crash"
        assert "closed the connection during die" in contents(result)[0]
        assert "the episode is over" in contents(result)[1]
        env.reset()
        assert contents(env.step(call("increment")))[0] == "1"
    with pytest.raises(OSError):
        toolgym.mcp(["/nonexistent/mcp-server"], errlog=quiet)().reset()


def test_each_episode_gets_a_fresh_server_process(server_file, quiet):
    def reward(episode: MCPEpisode) -> float:
        return float(episode.call("score") == "1.0") + len(episode.calls) / 10

    env = toolgym.mcp([sys.executable, str(server_file)], reward=reward, errlog=quiet)()
    try:
        pids = []
        for _ in range(2):
            env.reset(seed=0)
            first = env.step(call("pid"))
            assert contents(env.step(call("increment")))[0] == "1"  # no state carried over
            pids.append(int(contents(first)[0]))
        assert pids[0] != pids[1]
        env.final_answer("done")
        assert env.get_reward() == pytest.approx(0.2)
    finally:
        env.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_astep_calls_the_server_without_blocking_and_both_rewards_add_up(server_file, quiet):
    env = toolgym.mcp(
        [sys.executable, str(server_file)],
        reward_tool="score",
        reward=lambda episode: 0.5 if episode.answer == "3" else 0.0,
        reset_tool="start",
        errlog=quiet,
    )()

    async def play():
        env.reset()
        steps = [await env.astep(call("increment"), call_timeout=30) for _ in range(3)]
        env.final_answer("3")
        return steps

    try:
        assert [contents(step)[0] for step in asyncio.run(play())] == ["1", "2", "3"]
        assert env.get_reward() == 1.5
    finally:
        env.close()


def test_a_streamable_http_server_is_an_environment_with_a_session_per_episode(server_file, quiet):
    port = free_port()
    with http_server([sys.executable, str(server_file), str(port)], port) as url:
        env = toolgym.mcp(url, reward_tool="score", reset_tool="start")
        toolgym.register("test/McpHttpCounter-v0", env)
        with toolgym.make("test/McpHttpCounter-v0") as instance:
            names = {tool["function"]["name"] for tool in instance.tools}
            assert names == {"increment", "divide", "pid", "die", "picture"}
            instance.reset(target=1)
            assert contents(instance.step(call("increment")))[0] == "1"
            assert instance.get_reward() == 1.0
            failed = instance.step(call("divide", a=1, b=0))
            assert failed.info["failures"][0]["kind"] == "tool_error"
            first = instance.executor.session
            instance.reset(target=1)  # a new HTTP session; the last one is closed
            assert instance.executor.session is not first and first.client is None
            assert contents(instance.step(call("increment", by=1)))[0] == "1"


def test_an_mcp_environment_cannot_be_sandboxed_and_says_why(server_file):
    toolgym.register("test/McpSandboxed-v0", toolgym.mcp([sys.executable, str(server_file)]))
    with pytest.raises(TypeError, match="sandbox a stdio server by wrapping its command"):
        toolgym.make("test/McpSandboxed-v0", sandbox="process")


# -- a server from PyPI that this project did not write: mcp-server-time ----------------------

TIME_QUESTION = "It is 14:00 in Europe/Paris. What time is it in Asia/Tokyo? Use convert_time."


def time_server(**options):
    """mcp-server-time (PyPI), in UTC: `get_current_time` and `convert_time`."""
    command = Path(sys.executable).with_name("mcp-server-time")
    if not command.exists():
        pytest.skip("mcp-server-time is not installed (pip install -e '.[dev]')")
    return toolgym.mcp([str(command), "--local-timezone", "UTC"], **options)


def tokyo_time(episode: MCPEpisode) -> float:
    """1 if the final answer holds the time the server itself converts (asked in the
    episode's own server process)."""
    converted = episode.call(
        "convert_time", source_timezone="Europe/Paris", time="14:00", target_timezone="Asia/Tokyo"
    )
    hour = converted.split('"datetime": "')[2][11:16]  # the target's local time, "22:00"
    return float(episode.answer is not None and hour in episode.answer)


def test_a_scripted_agent_calls_a_pypi_mcp_server(quiet):
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    convert = (
        '<tool_call>\n{"name": "convert_time", "arguments": {"source_timezone": "Europe/Paris", '
        '"time": "14:00", "target_timezone": "Asia/Tokyo"}}\n</tool_call><|im_end|>'
    )
    agent = scripted_agent(tiny_tokenizer(), [convert, "22:00<|im_end|>"], max_turns=3)
    env = time_server(reward=tokyo_time, errlog=quiet)()
    try:
        (trajectory,) = agent.run([env], [{"prompt": TIME_QUESTION}])
    finally:
        env.close()
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert '"time_difference": "+8.0h"' in trajectory.messages[2]["content"]
    assert trajectory.status == "finished" and trajectory.reward == 1.0


def test_grpo_trains_one_step_against_a_pypi_mcp_server(tmp_path, quiet):
    env = time_server(
        reward=tokyo_time, dataset=[{"prompt": TIME_QUESTION}], max_turns=2, errlog=quiet
    )
    # the factory itself as env (an id registered with it works the same)
    metrics = one_grpo_step(env, env.dataset_builder(2, seed=0), tmp_path)
    assert metrics["statuses"].get("env_error", 0) == 0
    assert "loss" in metrics and metrics["reward"] == 0.0  # a random model never says 22:00


# -- toolgym serve --protocol mcp, driven by the SDK's own client ------------------------------

SERVE = [sys.executable, "-m", "toolgym", "serve", "Wordle-v0", "--protocol", "mcp"]


def test_the_sdk_client_plays_wordle_over_stdio_against_toolgym_serve():
    from mcp import Client, StdioServerParameters

    async def play():
        server = StdioServerParameters(command=SERVE[0], args=[*SERVE[1:], "--stdio"])
        async with Client(server) as client:  # the SDK's default negotiation
            names = [tool.name for tool in (await client.list_tools()).tools]
            guess = await client.call_tool("guess", {"word": "crane"})  # resets by itself
            await client.call_tool("reset", {"seed": 0, "answer": "slate"})
            invalid = await client.call_tool("guess", {"word": "zzzzz"})
            won = await client.call_tool("guess", {"word": "slate"})
            reward = await client.call_tool("reward", {})
            over = await client.call_tool("guess", {"word": "crane"})
            return names, guess, invalid, won, reward, over

    names, guess, invalid, won, reward, over = asyncio.run(play())
    assert names == ["guess", "reset", "reward", "final_answer"]
    assert guess.content[0].text.startswith("Guess 1/6") and not guess.is_error
    assert invalid.is_error and "not in the word list" in invalid.content[0].text
    assert "Correct!" in won.content[0].text
    assert won.meta["toolgym/reward"] == 1.0 and won.meta["toolgym/done"] is True
    assert reward.structured_content == {"reward": 1.0, "done": True, "turn": 2}  # a call, a turn
    assert reward.content[0].text == "1.0"
    assert over.is_error and "the episode is over" in over.content[0].text


def test_toolgym_serve_over_http_keeps_an_instance_per_session():
    """The SDK's default client (`mode='auto'`) over streamable HTTP: the server advertises
    only handshake-era versions, so the client opens a session by itself (it used to pick the
    sessionless 2026-07-28 protocol and every call failed)."""
    from mcp import Client

    process = subprocess.Popen([*SERVE, "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().strip()

        async def play():
            async with Client(url) as first, Client(url) as second:
                await first.call_tool("reset", {"answer": "crane"})
                await second.call_tool("reset", {"answer": "slate"})
                won = await first.call_tool("guess", {"word": "crane"})
                lost = await second.call_tool("guess", {"word": "crane"})
                versions = (first.protocol_version, second.protocol_version)
            async with Client(url, mode="2026-07-28") as sessionless:  # forced: no session
                refused = await sessionless.call_tool("guess", {"word": "crane"})
            return won, lost, versions, refused

        won, lost, versions, refused = asyncio.run(play())
        assert won.meta["toolgym/done"] is True and lost.meta["toolgym/done"] is False
        assert all(version != "2026-07-28" for version in versions), versions
        assert refused.is_error and "initialize handshake" in refused.content[0].text
    finally:
        process.terminate()
        assert process.wait(30) == 0  # SIGTERM: the instances are closed, the server stops
        process.stdout.close()


def test_a_served_environment_is_an_environment_again_through_toolgym_mcp():
    env = toolgym.mcp([*SERVE, "--stdio"], reset_tool="reset", reward_tool="reward")
    toolgym.register("test/McpWordle-v0", env)
    with toolgym.make("test/McpWordle-v0") as wordle:
        assert [tool["function"]["name"] for tool in wordle.tools] == ["guess", "final_answer"]
        assert wordle.reset(seed=0, answer="crane") is None  # Wordle shows nothing at reset
        result = wordle.step([call("guess", word="slate"), call("guess", word="crane")])
        assert "Correct!" in contents(result)[1]
        assert wordle.get_reward() == 1.0
