"""OpenEnv both ways, with openenv-core on loopback: an OpenEnv server built with its own server
helpers (`create_fastapi_app`) played through `toolgym.openenv` (and trained for a GRPO step);
and `toolgym serve --protocol openenv` driven by openenv-core's own client."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from typing import Any
from uuid import uuid4

import pytest
from helpers import one_grpo_step

import toolgym

pytest.importorskip("openenv.core")

from openenv.core import GenericEnvClient
from openenv.core.env_server import (
    Action,
    Environment,
    Observation,
    State,
    create_fastapi_app,
)
from pydantic import Field


class GuessAction(Action):
    """Guess the secret word."""

    word: str = Field(..., description="A lowercase word.")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="What the guess earned.")


class SecretWordEnvironment(Environment):
    """Guess a secret word: 1 for it (the episode ends), 0 for another word, no reward (None)
    for "pass"; "boom" raises in the server."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret = "crane"
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, secret: str = "crane"):
        self.secret = secret
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(feedback="Guess the secret word with guess(word).")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any):  # type: ignore[override]
        self._state.step_count += 1
        if action.word == "boom":
            raise ValueError("the word blew up")
        if action.word == "pass":
            return GuessObservation(feedback="Passed.")
        correct = action.word == self.secret
        feedback = "Correct!" if correct else f"{action.word} is not the word."
        return GuessObservation(feedback=feedback, done=correct, reward=float(correct))

    @property
    def state(self) -> State:
        return self._state


@contextlib.contextmanager
def uvicorn_thread(app: Any):
    """Serve a FastAPI app on a free loopback port in a thread until the block ends; its URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def url():
    app = create_fastapi_app(
        SecretWordEnvironment, GuessAction, GuessObservation, max_concurrent_envs=16
    )
    with uvicorn_thread(app) as address:
        yield address


def call(name: str, **arguments) -> toolgym.ToolCall:
    return toolgym.ToolCall(name, arguments)


def contents(result) -> list[str]:
    return [message["content"] for message in result.messages]


# -- an OpenEnv server as an environment -------------------------------------------------------


def test_an_openenv_server_is_an_environment_through_register_and_make(url):
    toolgym.register("test/SecretWord-v0", toolgym.openenv(url))
    with toolgym.make("test/SecretWord-v0") as env:
        (tool,) = env.tools
        assert tool["function"]["name"] == "guess"
        assert tool["function"]["description"] == "Guess the secret word."
        assert tool["function"]["parameters"]["required"] == ["word"]
        assert "metadata" not in tool["function"]["parameters"]["properties"]
        assert env.reset(seed=0, secret="slate") == "Guess the secret word with guess(word)."
        assert env.get_reward() is None  # the reset gave none: "no reward", not 0
        wrong = env.step(call("guess", word="crane"))
        assert contents(wrong) == ["crane is not the word."] and env.get_reward() == 0.0
        won = env.step(call("guess", word="slate"))
        assert contents(won) == ["Correct!"] and won.reward == 1.0 and won.terminated
        assert env.done and env.get_reward() == 1.0
        after = env.step(call("guess", word="slate"))
        assert after.results[0].failure == "episode_over"
        assert env.reset(secret="crane") and not env.done and env.get_reward() is None


def test_refusals_and_server_errors_are_tool_failures_and_none_rewards_stay_none(url):
    with toolgym.openenv(url, reward="last")() as env:
        env.reset()
        missing = env.step(call("guess"))  # checked against the schema here, never sent
        assert missing.results[0].failure == "invalid_arguments"
        assert "word" in contents(missing)[0]
        boom = env.step(call("guess", word="boom"))
        assert boom.results[0].failure == "tool_error"
        assert "the word blew up" in contents(boom)[0]
        assert env.step(call("guess", word="pass")).results[0].ok
        assert env.get_reward() is None and not env.done
        assert contents(env.step(call("guess", word="crane"))) == ["Correct!"]


def test_each_instance_has_its_own_session_and_astep_does_not_block(url):
    factory = toolgym.openenv(GenericEnvClient(base_url=url))  # a client: its URL is used
    assert factory.url == url

    async def play(secret: str) -> list[str]:
        with factory() as env:
            await asyncio.to_thread(env.reset, secret=secret)
            first = await env.astep(call("guess", word="crane"))
            second = await env.astep(call("guess", word=secret))
            return contents(first) + contents(second)

    async def both():
        return await asyncio.gather(play("crane"), play("slate"))

    crane, slate = asyncio.run(both())
    assert crane == ["Correct!", "Error: the episode is over; no more tool calls are accepted."]
    assert slate == ["crane is not the word.", "Correct!"]


def test_a_lost_session_ends_the_episode_and_the_next_reset_opens_a_new_one(url):
    from toolgym.adapters.mcp_session import submit

    with toolgym.openenv(url)() as env:
        env.reset(secret="slate")
        submit(env.executor.client._ws.close()).result(10)  # the server's side is gone too
        lost = env.step(call("guess", word="slate"))
        assert lost.results[0].failure == "env_error" and lost.info["ended"] == "env_error"
        env.reset(secret="slate")
        assert contents(env.step(call("guess", word="slate"))) == ["Correct!"]


def test_a_server_that_is_gone_ends_the_episode_env_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = toolgym.openenv(f"http://127.0.0.1:{port}", timeout=2)()
    with pytest.raises(ConnectionError):
        env.reset()
    env.close()


def test_a_scripted_agent_plays_an_openenv_server(url):
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    guess = '<tool_call>\n{"name": "guess", "arguments": {"word": "%s"}}\n</tool_call><|im_end|>'
    agent = scripted_agent(tiny_tokenizer(), [guess % "crane", guess % "slate"], max_turns=3)
    with toolgym.openenv(url)() as env:
        (trajectory,) = agent.run([env], [{"prompt": "Find the word.", "secret": "slate"}])
    assert [m["role"] for m in trajectory.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert trajectory.messages[0]["content"].endswith("Guess the secret word with guess(word).")
    assert trajectory.status == "env_done" and trajectory.reward == 1.0


def test_grpo_trains_one_step_against_an_openenv_server(url, tmp_path):
    env = toolgym.openenv(url, dataset=[{"prompt": "Find the word.", "secret": "slate"}])
    # the factory itself as env (an id registered with it works the same)
    metrics = one_grpo_step(env, env.dataset_builder(2, seed=0), tmp_path)
    assert metrics["statuses"].get("env_error", 0) == 0
    assert "loss" in metrics


# -- toolgym serve --protocol openenv, driven by openenv-core's own client ---------------------

SERVE = [sys.executable, "-m", "toolgym", "serve", "Wordle-v0", "--protocol", "openenv"]


@pytest.fixture(scope="module")
def served():
    """`toolgym serve Wordle-v0 --protocol openenv --port 0`: its URL; stopped by SIGTERM."""
    process = subprocess.Popen([*SERVE, "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://"), "toolgym serve did not start"
        yield url
    finally:
        process.terminate()
        assert process.wait(30) == 0  # SIGTERM: the instances are closed, the server stops
        process.stdout.close()


def guess(word: str) -> dict:
    return {"tool": "guess", "arguments": {"word": word}}


def test_the_openenv_client_plays_wordle_against_toolgym_serve(served):
    with GenericEnvClient(base_url=served).sync() as client:
        started = client.reset(seed=0, answer="slate")
        invalid = client.step(guess("zzzzz"))
        wrong = client.step(guess("crane"))
        won = client.step(guess("slate"))
        state = client.state()
        over = client.step(guess("crane"))
    assert [tool["function"]["name"] for tool in started.observation["tools"]] == ["guess"]
    assert started.reward is None and not started.done
    assert invalid.observation["failure"] == "tool_error" and not invalid.done
    assert "not in the word list" in invalid.observation["content"]
    assert wrong.observation["content"].startswith("Guess 1/6") and wrong.reward == 0.0
    assert "Correct!" in won.observation["content"] and won.done and won.reward == 1.0
    assert state["step_count"] == 3 and state["reward"] == 1.0 and state["done"] is True
    assert over.observation["failure"] == "episode_over"


def test_toolgym_serve_keeps_an_instance_per_session_and_publishes_its_schema(served):
    import json
    import urllib.request

    with urllib.request.urlopen(f"{served}/schema", timeout=10) as answer:
        action = json.load(answer)["action"]
    assert action["properties"]["tool"]["enum"] == ["guess", "final_answer"]

    async def play():
        first, second = GenericEnvClient(base_url=served), GenericEnvClient(base_url=served)
        async with first, second:
            await first.reset(answer="crane")
            await second.reset(answer="slate")
            won = await first.step(guess("crane"))
            lost = await second.step(guess("crane"))
            answered = await second.step({"tool": "final_answer", "arguments": {"text": "no"}})
        return won, lost, answered

    won, lost, answered = asyncio.run(play())
    assert won.done and not lost.done
    assert answered.done and answered.observation["tool"] == "final_answer"


def test_a_served_environment_is_an_environment_again_through_toolgym_openenv(served):
    env = toolgym.openenv(served, observation=lambda o: o["content"])
    with env() as wordle:
        (tool,) = wordle.tools
        assert tool["function"]["name"] == "tool_call"
        assert wordle.reset(seed=0, answer="crane") is None  # Wordle shows nothing at reset
        result = wordle.step(toolgym.ToolCall("tool_call", guess("crane")))
        assert "Correct!" in contents(result)[0]
        assert wordle.done and wordle.get_reward() == 1.0
