"""Attacks on toolgym's listening surfaces (issue 43, family 1): `toolgym serve` over MCP and
OpenEnv, `toolgym endpoint` and the run viewer, each a real server on loopback driven by real
clients (httpx, the `websockets` package, the `mcp` SDK's client, openenv-core's client).

Each test makes one attack and asserts both the refusal and that the legitimate client still
works after it. The families: a foreign Host header (DNS rebinding), a foreign Origin (a web
page, over HTTP or a WebSocket upgrade), a cross-site simple POST (`text/plain`), a listener
beyond loopback without the token, newcomers past `--max-sessions` (no live session evicted,
stateless calls counted too), idle sessions (expired and closed), a sessionless request
carrying another session's id, and code-running environments served without a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

pytest.importorskip("uvicorn")

TOOLGYM = [sys.executable, "-m", "toolgym"]
FOREIGN = "http://evil.example"
JSON = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
LEGACY = "2025-11-25"

COUNTER = textwrap.dedent(
    '''
    """A counter that writes each instance's making and closing to $COUNTER_LOG."""
    import os
    import time

    import toolgym


    class Counter:
        """Add numbers; the reward is the total."""

        def __init__(self):
            self.total = 0
            self._log("made")

        def _log(self, what):
            with open(os.environ["COUNTER_LOG"], "a") as log:
                log.write(f"{what} {id(self)}\\n")

        def reset(self, seed=None, start: int = 0):
            self.total = start
            return f"The total is {start}."

        def add(self, n: int) -> str:
            """Add n to the total (after $COUNTER_DELAY seconds).

            Args:
                n: The number to add.
            """
            time.sleep(float(os.environ.get("COUNTER_DELAY", "0")))
            self.total += n
            return str(self.total)

        def get_reward(self):
            return float(self.total)

        @toolgym.hook
        def close(self):
            self._log("closed")
    '''
)


# -- running servers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def counter_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("served") / "counter_env.py"
    path.write_text(COUNTER)
    return path


class Served:
    """A `toolgym serve` (or other) process: its printed URL, its log of instances."""

    def __init__(self, command: list[str], log: Path | None = None, **env: str) -> None:
        environment = {k: v for k, v in os.environ.items() if k != "TOOLGYM_TOKEN"}
        environment.update(env)
        if log is not None:
            environment["COUNTER_LOG"] = str(log)
        self.log = log
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        )
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.stop()
            raise AssertionError(f"the server did not start: {self.stderr}")
        parts = urlsplit(self.url)
        self.port = parts.port
        self.token = parts.password
        self.path = parts.path
        self.stderr = ""

    def local(self, path: str = "") -> str:
        """The URL on 127.0.0.1 (without the token)."""
        return f"http://127.0.0.1:{self.port}{path}"

    def counts(self) -> tuple[int, int]:
        """(instances made, instances closed), the startup probe included."""
        lines = self.log.read_text().split() if self.log and self.log.exists() else []
        return lines.count("made"), lines.count("closed")

    def peak(self) -> int:
        """The most instances that were alive at once."""
        alive = most = 0
        for line in self.log.read_text().splitlines():
            alive += 1 if line.startswith("made") else -1
            most = max(most, alive)
        return most

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr = self.process.stderr.read()
        self.process.stdout.close()
        self.process.stderr.close()


@contextlib.contextmanager
def serving(*arguments: str, log: Path | None = None, **env: str):
    served = Served([*TOOLGYM, "serve", *arguments, "--port", "0"], log, **env)
    try:
        yield served
    finally:
        served.stop()


def refused_to_start(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command that must refuse to start; a server that starts anyway is stopped."""
    environment = {k: v for k, v in os.environ.items() if k != "TOOLGYM_TOKEN"}
    process = subprocess.Popen(
        [*TOOLGYM, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        out, err = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def rebound(served: Served, path: str = "", scheme: str = "http") -> tuple[str, socket.socket]:
    """A URL on a foreign name and a socket to the server: what a DNS-rebound page sends."""
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    return f"{scheme}://evil.example:{served.port}{path}", sock


# -- MCP -------------------------------------------------------------------------------------------

mcp = pytest.importorskip("mcp")


def initialize(client: httpx.Client, url: str, **headers: str) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "attacker", "version": "1"},
        },
    }
    return client.post(url, json=body, headers={**JSON, **headers})


async def play_wordle(url: str) -> list:
    """The legitimate client: the SDK's default `Client`, one Wordle episode."""
    from mcp import Client

    async with Client(url) as client:
        await client.call_tool("reset", {"answer": "crane"})
        first = await client.call_tool("guess", {"word": "slate"})
        won = await client.call_tool("guess", {"word": "crane"})
    return [first, won]


def assert_plays(url: str) -> None:
    first, won = asyncio.run(play_wordle(url))
    assert not first.is_error and first.meta["toolgym/turn"] == 1, first
    assert "Correct!" in won.content[0].text and won.meta["toolgym/done"] is True


@pytest.fixture(scope="module")
def mcp_wordle():
    with serving("Wordle-v0", "--protocol", "mcp") as served:
        yield served


def test_mcp_refuses_a_dns_rebound_host(mcp_wordle):
    with httpx.Client(timeout=30) as client:
        answer = initialize(
            client, mcp_wordle.local("/mcp"), Host=f"evil.example:{mcp_wordle.port}"
        )
    assert answer.status_code in (403, 421), answer.text
    assert "mcp-session-id" not in answer.headers
    assert_plays(mcp_wordle.url)


def test_mcp_refuses_a_foreign_origin(mcp_wordle):
    with httpx.Client(timeout=30) as client:
        answer = initialize(client, mcp_wordle.local("/mcp"), Origin=FOREIGN)
    assert answer.status_code == 403, answer.text
    assert "mcp-session-id" not in answer.headers
    assert_plays(mcp_wordle.url)


def test_mcp_refuses_a_cross_site_text_plain_post(mcp_wordle):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    with httpx.Client(timeout=30) as client:
        answer = client.post(
            mcp_wordle.local("/mcp"), content=body, headers={"Content-Type": "text/plain"}
        )
    assert answer.status_code in (400, 415), answer.text
    assert "mcp-session-id" not in answer.headers
    assert_plays(mcp_wordle.url)


def test_mcp_sessionless_request_with_another_sessions_id_reads_nothing(mcp_wordle):
    """A 2026-07-28 (sessionless) request naming the victim's session id neither reads nor
    drives the victim's episode."""
    headers = {"mcp-protocol-version": LEGACY}
    with httpx.Client(timeout=30) as client:
        opened = initialize(client, mcp_wordle.local("/mcp"))
        victim = {**JSON, **headers, "mcp-session-id": opened.headers["mcp-session-id"]}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        client.post(mcp_wordle.local("/mcp"), json=note, headers=victim)

        def call(name: str, arguments: dict, **extra: str) -> dict:
            body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
            body["params"] = {"name": name, "arguments": arguments}
            if extra.get("mcp-protocol-version") == "2026-07-28":
                body["params"]["_meta"] = {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "attacker", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            sent = client.post(mcp_wordle.local("/mcp"), json=body, headers={**victim, **extra})
            text = sent.text
            data = text[text.index("{") :].splitlines()[0] if "{" in text else "{}"
            return json.loads(data)

        call("reset", {"answer": "crane"})
        call("guess", {"word": "slate"})
        modern = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call"}
        stolen = call("reward", {}, **modern, **{"mcp-name": "reward"})
        driven = call("guess", {"word": "crane"}, **modern, **{"mcp-name": "guess"})
        mine = call("reward", {})
    for answer in (stolen, driven):
        result = answer.get("result", {})
        assert "error" in answer or result.get("isError"), answer
        assert "structuredContent" not in result, answer
    assert mine["result"]["structuredContent"] == {"reward": 0.0, "done": False, "turn": 1}
    assert_plays(mcp_wordle.url)


def test_mcp_newcomer_past_max_sessions_is_refused_and_no_live_episode_is_evicted(counter_file):
    from mcp import Client

    async def attack(url: str):
        async with Client(url) as trainer:
            await trainer.call_tool("reset", {"start": 10})
            await trainer.call_tool("add", {"n": 1})
            refusals = []
            for _ in range(3):  # newcomers, each one trying to open a session
                try:
                    async with Client(url) as newcomer:
                        await newcomer.call_tool("reset", {"start": 0})
                except Exception as error:  # the SDK raises the server's refusal
                    refusals.append(error)
            after = await trainer.call_tool("add", {"n": 1})
        return refusals, after

    with serving(
        f"{counter_file}:Counter", "--max-sessions", "1", log=counter_file.with_suffix(".log")
    ) as served:
        refusals, after = asyncio.run(attack(served.url))
        assert len(refusals) == 3
        assert all("--max-sessions" in _message(error) for error in refusals), refusals
        assert after.content[0].text == "12", after  # the trainer's episode went on
        made, _ = served.counts()
        assert made == 2  # the probe and the trainer's instance; no newcomer's


def _message(error: BaseException) -> str:
    parts = [str(error)]
    for inner in getattr(error, "exceptions", ()):
        parts.append(_message(inner))
    if error.__cause__ is not None:
        parts.append(_message(error.__cause__))
    return " ".join(parts)


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_mcp_idle_sessions_expire_and_their_instances_close(counter_file, tmp_path):
    from mcp import Client

    log = tmp_path / "idle.log"

    async def idle(url: str):
        async with Client(url) as client:
            await client.call_tool("reset", {"start": 1})
        async with Client(url) as lingering:  # leaves its session idle, never deleted
            await lingering.call_tool("reset", {"start": 2})
            await asyncio.sleep(6)
            try:
                late = await lingering.call_tool("add", {"n": 1})
            except Exception as error:
                late = error
        async with Client(url) as fresh:
            return late, await fresh.call_tool("add", {"n": 5})

    with serving(
        f"{counter_file}:Counter", "--max-sessions", "2", "--session-idle-timeout", "2", log=log
    ) as served:
        late, fresh = asyncio.run(idle(served.url))
        made, closed = served.counts()
    assert made == 4 and closed == 4, (made, closed)  # every instance closed, none made anew
    assert isinstance(late, Exception) or late.is_error, late  # not a silent new episode
    assert "idle" in _message(late) if isinstance(late, Exception) else late.content[0].text
    assert fresh.content[0].text == "5"


def test_mcp_beyond_loopback_needs_the_token(tmp_path):
    """Bound to every address without a token, the server makes one, prints it in its URL,
    and refuses every request that does not carry it."""
    with serving("Wordle-v0", "--protocol", "mcp", "--host", "0.0.0.0") as served:
        assert served.token and len(served.token) >= 16, served.url
        with httpx.Client(timeout=30) as client:
            bare = initialize(client, served.local("/mcp"))
            wrong = initialize(client, served.local("/mcp"), Authorization="Bearer " + "x" * 32)
        assert bare.status_code == 401 and wrong.status_code == 401, (bare.text, wrong.text)
        assert "mcp-session-id" not in bare.headers
        assert_plays(f"http://toolgym:{served.token}@127.0.0.1:{served.port}/mcp")
    short = refused_to_start("serve", "Wordle-v0", "--host", "0.0.0.0", "--token", "short")
    assert short.returncode == 2 and "--token" in short.stderr, short.stderr


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.parametrize("protocol", ["mcp", "openenv"])
def test_a_code_running_class_is_not_served_outside_a_sandbox(protocol):
    """`module:Class` of a `runs_model_code` environment was served in this process: a web
    page's code ran on the host. Refused, naming --sandbox."""
    done = refused_to_start(
        "serve",
        "toolgym.builtin_envs.python_repl:PythonREPL",
        "--protocol",
        protocol,
        "--port",
        "0",
    )
    assert done.returncode == 2 and "--sandbox" in done.stderr, (done.stdout, done.stderr)
    assert not done.stdout.startswith("http")
    local = refused_to_start("serve", "PythonREPL-v0", "--sandbox", "local", "--port", "0")
    assert local.returncode == 2 and "--sandbox" in local.stderr, local.stderr


# -- OpenEnv ---------------------------------------------------------------------------------------

pytest.importorskip("openenv")
websockets = pytest.importorskip("websockets")


@pytest.fixture(scope="module")
def openenv_wordle():
    with serving("Wordle-v0", "--protocol", "openenv", "--max-sessions", "2") as served:
        yield served


def openenv_plays_twice(url: str) -> None:
    """The trainer's client: two sessions at once (both of `--max-sessions 2`)."""
    from openenv.core.generic_client import GenericEnvClient

    async def play():
        first, second = GenericEnvClient(base_url=url), GenericEnvClient(base_url=url)
        async with first, second:
            await first.reset(answer="crane")
            await second.reset(answer="slate")
            won = await first.step({"tool": "guess", "arguments": {"word": "crane"}})
            lost = await second.step({"tool": "guess", "arguments": {"word": "crane"}})
        return won, lost

    won, lost = asyncio.run(play())
    assert won.done and won.reward == 1.0 and not lost.done


async def _open_socket(uri: str, **options):
    return await websockets.connect(uri, open_timeout=10, **options)


def test_openenv_refuses_foreign_origin_sockets_and_keeps_the_trainers_slots(openenv_wordle):
    """Two sockets from a web page took both slots and turned the trainer away."""

    async def attack():
        held, refusals = [], []
        for _ in range(2):
            try:
                held.append(
                    await _open_socket(f"ws://127.0.0.1:{openenv_wordle.port}/ws", origin=FOREIGN)
                )
            except websockets.exceptions.InvalidStatus as error:
                refusals.append(error.response.status_code)
        return held, refusals

    async def run():
        held, refusals = await attack()
        try:
            await asyncio.to_thread(openenv_plays_twice, openenv_wordle.url)
        finally:
            for sock in held:
                await sock.close()
        return held, refusals

    held, refusals = asyncio.run(run())
    assert not held and refusals == [403, 403], refusals


def test_openenv_refuses_a_dns_rebound_host(openenv_wordle):
    url, sock = rebound(openenv_wordle, "/ws", "ws")

    async def attack():
        try:
            async with websockets.connect(url, sock=sock, open_timeout=10) as opened:
                await opened.send(json.dumps({"type": "reset", "data": {"answer": "crane"}}))
                return await opened.recv()
        except websockets.exceptions.InvalidStatus as error:
            return error.response.status_code

    status = asyncio.run(attack())
    with httpx.Client(timeout=30) as client:
        step = {"action": {"tool": "guess", "arguments": {"word": "crane"}}}
        posted = client.post(
            openenv_wordle.local("/step"),
            json=step,
            headers={"Host": f"evil.example:{openenv_wordle.port}"},
        )
    assert status in (403, 421) and posted.status_code in (403, 421), (status, posted.text)
    openenv_plays_twice(openenv_wordle.url)


def test_openenv_refuses_a_cross_site_text_plain_post(openenv_wordle):
    body = json.dumps({"action": {"tool": "guess", "arguments": {"word": "crane"}}})
    with httpx.Client(timeout=30) as client:
        posted = client.post(
            openenv_wordle.local("/step"), content=body, headers={"Content-Type": "text/plain"}
        )
        origin = client.post(openenv_wordle.local("/reset"), json={}, headers={"Origin": FOREIGN})
    assert posted.status_code == 415 and origin.status_code == 403, (posted.text, origin.text)
    openenv_plays_twice(openenv_wordle.url)


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_openenv_stateless_calls_count_against_max_sessions(counter_file, tmp_path):
    """10 concurrent stateless `POST /step` with a cap of 2 made an instance each (13
    sandboxes); now at most 2 instances exist at once and the rest are refused, named."""
    log = tmp_path / "stateless.log"
    arguments = (f"{counter_file}:Counter", "--protocol", "openenv", "--max-sessions", "2")
    with serving(*arguments, log=log, COUNTER_DELAY="3") as served:
        step = {"action": {"tool": "add", "arguments": {"n": 1}}}
        answers: list[httpx.Response] = []

        def one() -> None:
            with httpx.Client(timeout=60) as client:
                answers.append(client.post(served.local("/step"), json=step))

        threads = [threading.Thread(target=one) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        statuses = sorted(answer.status_code for answer in answers)
        assert served.peak() <= 2, (served.counts(), statuses)  # was 10 (11 made)
        full = [answer for answer in answers if answer.status_code == 503]
        assert full and all("--max-sessions" in answer.text for answer in full), statuses

        from openenv.core.generic_client import GenericEnvClient

        with GenericEnvClient(base_url=served.url).sync() as client:
            client.reset(start=1)
            assert client.step({"tool": "add", "arguments": {"n": 2}}).observation["content"] == "3"


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_openenv_idle_sockets_expire_and_their_instances_close(counter_file, tmp_path):
    from openenv.core.generic_client import GenericEnvClient

    log = tmp_path / "idle.log"
    arguments = (f"{counter_file}:Counter", "--protocol", "openenv", "--max-sessions", "1")
    with serving(*arguments, "--session-idle-timeout", "2", log=log) as served:
        idle = GenericEnvClient(base_url=served.url).sync()
        idle.connect()
        idle.reset(start=1)
        time.sleep(6)
        made, closed = served.counts()
        with pytest.raises(Exception):  # noqa: B017 (closed by the server: any client error)
            idle.step({"tool": "add", "arguments": {"n": 1}})
        idle.close()
        with GenericEnvClient(base_url=served.url).sync() as fresh:  # the slot is free again
            fresh.reset(start=4)
            assert fresh.step({"tool": "add", "arguments": {"n": 1}}).observation["content"] == "5"
    assert (made, closed) == (2, 2), (made, closed)


def test_openenv_token_guards_http_and_websocket():
    token = "t" * 8 + "0123456789abcdef"
    with serving("Wordle-v0", "--protocol", "openenv", "--token", token) as served:
        assert served.token == token

        async def bare():
            try:
                await _open_socket(f"ws://127.0.0.1:{served.port}/ws")
            except websockets.exceptions.InvalidStatus as error:
                return error.response.status_code

        with httpx.Client(timeout=30) as client:
            posted = client.post(served.local("/reset"), json={})
            schema = client.get(served.local("/schema"))
        assert posted.status_code == 401 and schema.status_code == 401
        assert asyncio.run(bare()) in (401, 403)
        from openenv.core.generic_client import GenericEnvClient

        with GenericEnvClient(base_url=served.url).sync() as client:  # the URL carries it
            client.reset(answer="crane")
            assert client.step({"tool": "guess", "arguments": {"word": "crane"}}).done
        import toolgym  # its /schema read over HTTP carries the URL's token too

        with toolgym.openenv(served.url, observation=lambda o: o["content"])() as wordle:
            wordle.reset(seed=0, answer="crane")
            arguments = {"tool": "guess", "arguments": {"word": "crane"}}
            wordle.step(toolgym.ToolCall("tool_call", arguments))
            assert wordle.get_reward() == 1.0


# -- toolgym endpoint ------------------------------------------------------------------------------


@pytest.fixture
def endpoint():
    from toolgym.agents import ScriptedEngine
    from toolgym.agents.endpoint import Endpoint
    from toolgym.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    reply = tokenizer.encode("fine<|im_end|>", add_special_tokens=False)
    engine = ScriptedEngine(lambda prompt: reply)
    with Endpoint(
        engine,
        tokenizer,
        parser="hermes",
        open_sessions=True,
        max_sessions=4,
        session_idle_timeout=4,
    ) as served:
        yield served


def chat(endpoint, key: str = "trainer", **headers: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {key}", **headers}
    return httpx.post(f"{endpoint.base_url}/chat/completions", json=body, headers=headers)


def test_endpoint_refuses_a_rebound_host_a_foreign_origin_and_text_plain(endpoint):
    port = endpoint.port
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    url = f"{endpoint.base_url}/chat/completions"
    host = chat(endpoint, "attacker", Host=f"evil.example:{port}")
    origin = chat(endpoint, "attacker", Origin=FOREIGN)
    plain = httpx.post(url, content=body, headers={"Content-Type": "text/plain"})
    models = httpx.get(f"{endpoint.base_url}/models", headers={"Host": f"evil.example:{port}"})
    assert host.status_code in (403, 421) and models.status_code in (403, 421)
    assert origin.status_code == 403 and plain.status_code == 415, (origin.text, plain.text)
    assert "attacker" not in endpoint.sessions and "user" not in endpoint.sessions
    answer = chat(endpoint)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "fine"


def test_endpoint_sessions_are_bounded_and_expire(endpoint):
    """Each new key made a session that was never freed (+0.74 KB per key)."""
    assert chat(endpoint).status_code == 200
    answers = [chat(endpoint, f"key-{index}") for index in range(20)]
    assert len(endpoint.sessions) <= 4
    full = [answer for answer in answers if answer.status_code != 200]
    assert full and all(answer.status_code == 429 for answer in full)
    assert "--max-sessions" in full[0].json()["error"]["message"]
    assert endpoint.trajectory("trainer").metrics["turns"] == 1  # a live session stays
    time.sleep(5)
    answer = chat(endpoint, "late-key")  # idle ones are gone: room again
    assert answer.status_code == 200 and "key-0" not in endpoint.sessions
    assert len(endpoint.sessions) == 1


def test_endpoint_beyond_loopback_needs_a_token():
    from toolgym.agents import ScriptedEngine
    from toolgym.agents.endpoint import Endpoint
    from toolgym.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine(
        lambda prompt: tokenizer.encode("ok<|im_end|>", add_special_tokens=False)
    )
    with pytest.raises(ValueError, match="token"):
        Endpoint(engine, tokenizer, host="0.0.0.0", open_sessions=True)
    token = "k" * 24
    with Endpoint(engine, tokenizer, parser="hermes", open_sessions=True, token=token) as served:
        bare = chat(served, "mine")
        wrong = chat(served, "x" * 24 + ":mine")
        right = chat(served, f"{token}:mine")
        header = chat(served, "other", **{"X-Toolgym-Token": token})
    assert bare.status_code == 401 and wrong.status_code == 401, bare.text
    assert right.status_code == 200 and header.status_code == 200, right.text
    assert set(served.sessions) == {"mine", "other"}


# -- the run viewer --------------------------------------------------------------------------------


def test_viewer_refuses_a_rebound_host_and_a_foreign_origin(tmp_path):
    from toolgym.viewer import start

    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_text(json.dumps({"messages": [], "reward": 1.0}) + "\n")
    server = start(run, port=0)
    try:
        port = urlsplit(server.url).port
        host = httpx.get(f"{server.url}api/summary", headers={"Host": f"evil.example:{port}"})
        origin = httpx.get(f"{server.url}api/summary", headers={"Origin": FOREIGN})
        own = httpx.get(f"{server.url}api/summary", headers={"Origin": server.url.rstrip("/")})
        assert host.status_code == 403 and origin.status_code == 403, (host.text, origin.text)
        assert own.status_code == 200 and httpx.get(f"{server.url}api/summary").status_code == 200
    finally:
        server.close()


# -- a real browser on another origin --------------------------------------------------------------

ATTACK = """
async () => {
  const STEP = '{"action": {"tool": "add", "arguments": {"n": 1}}}';
  const socket = await new Promise((done) => {
    const ws = new WebSocket("ws://127.0.0.1:%(openenv)d/ws");
    ws.onopen = () => { ws.send(JSON.stringify({type: "reset", data: {start: 7}})); };
    ws.onmessage = (event) => done("answered: " + event.data);
    ws.onerror = () => done("refused");
    setTimeout(() => done("timeout"), 10000);
  });
  const simple = {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}};
  const chat = JSON.stringify(
    {model: "m", user: "page", messages: [{role: "user", content: "hi"}]});
  const posts = [
    fetch("http://127.0.0.1:%(openenv)d/reset", {...simple, body: ""}),
    fetch("http://127.0.0.1:%(openenv)d/step", {...simple, body: STEP}),
    fetch("http://127.0.0.1:%(endpoint)d/v1/chat/completions", {...simple, body: chat}),
  ];
  const sent = await Promise.all(posts.map((post) => post.then(() => "sent", () => "failed")));
  return {socket, sent};
}
"""


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_a_web_page_in_chromium_cannot_drive_the_servers(counter_file, tmp_path, endpoint):
    """A page of another origin (a local page on another port), in headless Chromium, opens a
    WebSocket to `toolgym serve --protocol openenv` and sends simple POSTs to it and to
    `toolgym endpoint`: no instance is made, no session opened; the trainer's client plays."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from browser import Browser, find_chromium

    if find_chromium() is None:
        pytest.skip("no chromium installed (scripts/browser_setup.sh installs it)")
    (tmp_path / "index.html").write_text("<!doctype html><title>a page</title><body>hi</body>")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    page = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(tmp_path)))
    thread = threading.Thread(target=page.serve_forever, daemon=True)
    thread.start()
    log = tmp_path / "browser.log"
    arguments = (f"{counter_file}:Counter", "--protocol", "openenv", "--max-sessions", "1")
    try:
        with serving(*arguments, log=log) as served, Browser() as browser:
            browser.goto(f"http://127.0.0.1:{page.server_address[1]}/index.html")
            ports = {"openenv": served.port, "endpoint": endpoint.port}
            result = browser.evaluate(f"({ATTACK % ports})()")
            time.sleep(1)  # anything the posts started has had time to make an instance
            assert result["socket"] == "refused", result
            assert served.counts() == (1, 1)  # the startup probe only
            assert not endpoint.sessions, endpoint.sessions
            from openenv.core.generic_client import GenericEnvClient

            with GenericEnvClient(base_url=served.url).sync() as client:  # its one slot
                client.reset(start=1)
                assert (
                    client.step({"tool": "add", "arguments": {"n": 1}}).observation["content"]
                    == "2"
                )
    finally:
        page.shutdown()
        page.server_close()
