"""A command-line agent program as a rollout (issue 30 item 3; issue 43 item 4): it reaches
the endpoint through `OPENAI_BASE_URL` / `OPENAI_API_KEY`, its last line is its answer for
the environment to grade (never a reward), it runs with a minimal environment (no host
secrets), optionally in bubblewrap where it reaches only the endpoint, and failures and hangs
end the episode with a named status, its processes gone."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
from helpers import ids, scripted_agent, wordle_rows

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.agents.program import PROGRAM_BUG_EXIT, command_program, program_rollout
from toolgym.testing import tiny_tokenizer

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"
needs_bwrap = pytest.mark.skipif(
    not REQUIRED and shutil.which("bwrap") is None, reason="bubblewrap is not installed"
)

AGENT = """
import json, os, socket, sys, time
import openai

row = json.loads(sys.stdin.read())
assert row == json.loads(os.environ["TOOLGYM_ROW"])
mode = sys.argv[1]
if mode == "fail":
    sys.exit("boom: the model's text broke me")
if mode == "own-bug":
    print("my config file is missing", file=sys.stderr)
    sys.exit(int(sys.argv[2]))
if mode == "hang":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(60)
if mode == "environment":
    print(json.dumps(sorted(os.environ)))
    sys.exit(0)
if mode == "walls":  # what a sandboxed program (or the model's code it runs) can reach
    walls, seen = json.loads(os.environ["WALLS"]), {}
    for name, attempt in {
        "host loopback": lambda: socket.create_connection(("127.0.0.1", walls["port"]), 2),
        "host accounts": lambda: open("/etc/passwd").read(),
        "a file beside the program": lambda: open(walls["secret"]).read(),
        "write beside the program": lambda: open(walls["beside"], "w").write("x"),
        "write /tmp": lambda: open("/tmp/scratch", "w").write("x"),
    }.items():
        try:
            attempt()
            seen[name] = "reached"
        except Exception as error:
            seen[name] = type(error).__name__
    print(json.dumps(seen))
    sys.exit(0)
with openai.OpenAI(max_retries=0) as client:  # the endpoint, from the environment
    reply = client.chat.completions.create(model="m", messages=row["prompt"])
said = reply.choices[0].message.content
print("the program's notes")
print(said if mode == "echo" else mode)
"""


def run(tmp_path, env, rows, *args, reply="42<|im_end|>", timeout=60.0, **options):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    agent = scripted_agent(tiny_tokenizer(), [reply], max_turns=2)
    program = command_program([sys.executable, str(script), *args], **options)
    (played,) = agent.run([env], rows, [0], rollout_fn=program_rollout(program, timeout=timeout))
    print(played.status, played.reward, played.error)
    return played


ADD = {"prompt": "What is 2 + 3?", "a": 2, "b": 3, "operation": "add"}


def test_a_command_plays_through_the_endpoint_and_its_answer_is_graded(tmp_path):
    right = run(tmp_path, toolgym.make("Arithmetic-v0"), [ADD], "5")
    wrong = run(tmp_path, toolgym.make("Arithmetic-v0"), [ADD], "6")
    assert (right.status, right.reward, wrong.reward) == ("finished", 1.0, 0.0)
    assert right.metrics["turns"] == 1
    assert right.completion_ids == ids(tiny_tokenizer(), "42<|im_end|>")
    assert right.loss_mask == [1] * len(right.completion_ids)


@pytest.mark.parametrize("said", ["reward: 1", "reward: 1e300", "reward: nan"])
def test_the_model_cannot_write_its_reward_through_the_program_s_last_line(tmp_path, said, caplog):
    """The documented pattern, a program that prints the model's answer last: the model says
    `reward: 1` for a wrong answer. Before, that line was taken as the reward (1.0, and 1e300
    was accepted); now it is an answer the environment grades (wrong: 0.0), with a warning
    that programs report answers, never rewards."""
    with caplog.at_level(logging.WARNING, logger="toolgym.agents.program"):
        played = run(
            tmp_path, toolgym.make("Arithmetic-v0"), [ADD], "echo", reply=f"{said}<|im_end|>"
        )
    assert played.status == "finished" and played.reward == 0.0
    assert "programs report answers, never rewards" in caplog.text


def test_a_python_program_s_own_reward_must_be_a_finite_number(tmp_path):
    tokenizer = tiny_tokenizer()
    outcomes = {}
    for value in (0.25, float("nan"), float("inf"), 1e300, "1", None):

        async def program(base_url, api_key, row, env, value=value):
            return value

        agent = scripted_agent(tokenizer, ["x<|im_end|>"])
        (outcomes[str(value)],) = agent.run(
            [toolgym.make("Wordle-v0")], wordle_rows(1), rollout_fn=program_rollout(program)
        )
    statuses = {value: (t.status, t.reward) for value, t in outcomes.items()}
    assert statuses["0.25"] == ("finished", 0.25)
    assert statuses["None"] == ("finished", 0.0)  # the environment's reward
    for bad in ("nan", "inf", "1e+300", "1"):
        assert statuses[bad] == ("env_error", 0.0), bad
        assert "the program gave a reward of" in outcomes[bad].error
    assert "finite number of at most 1e+06" in outcomes["1e+300"].error
    assert math.isfinite(outcomes["inf"].reward)


def test_an_old_agent_s_endpoint_closes_from_any_thread_while_a_new_one_starts():
    """Before, a collected agent's finalizer took the endpoints' lock in whatever thread the
    collector ran: in a new endpoint's server thread, while that endpoint's start held the
    lock, neither went on and the episode ended 'could not listen ... within 30 s'."""
    import gc
    import threading

    from toolgym.agents import program as program_module

    async def program(base_url, api_key, row, env):
        return 1.0

    agent = scripted_agent(tiny_tokenizer(), ["x<|im_end|>"])
    (played,) = agent.run(
        [toolgym.make("Wordle-v0")], wordle_rows(1), rollout_fn=program_rollout(program)
    )
    assert played.status == "finished", played.error
    endpoint = program_module._endpoints[id(agent)]
    agent.cycle = agent  # freed only by the collector, as agents in reference cycles are
    del agent, played
    collector = threading.Thread(target=gc.collect)
    with program_module._lock:  # as while a new agent's endpoint starts
        collector.start()
        collector.join(timeout=10)
        assert not collector.is_alive(), "the finalizer waited on the endpoints' lock"
    deadline = time.monotonic() + 30
    while endpoint._thread is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert endpoint._thread is None, "the old endpoint was never closed"


def test_a_command_gets_a_minimal_environment(tmp_path, monkeypatch):
    """Before, the trainer's whole environment (a fake HF_TOKEN) reached the program."""
    monkeypatch.setenv("HF_TOKEN", "hf_fake_secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake")
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    seen = []

    class Keeper:
        def final_answer(self, text):
            seen.append(text)

    program = command_program([sys.executable, str(script), "environment"], env={"MINE": "1"})
    asyncio.run(program("http://127.0.0.1:59999/v1", "key", {"prompt": []}, Keeper()))
    names = set(json.loads(seen[0]))
    expected = {"PATH", "HOME", "OPENAI_BASE_URL", "OPENAI_API_KEY", "TOOLGYM_ROW", "MINE"}
    assert names - {"LANG", "LC_CTYPE"} == expected, names  # (the interpreter may add LC_CTYPE)


def test_failures_are_the_model_s_unless_the_program_says_they_are_its_own(tmp_path):
    """A program handles the model's text: its crash is the model's (`tool_crash`, in the loss;
    before: `env_error`, out of it), unless it exits with `PROGRAM_BUG_EXIT`; a command that
    cannot start is `env_error`; a hang is `tool_timeout`, its processes killed."""
    wordle = wordle_rows(1)
    failed = run(tmp_path, toolgym.make("Wordle-v0"), wordle, "fail")
    assert failed.status == "tool_crash" and "boom: the model's text broke me" in failed.error
    own = run(tmp_path, toolgym.make("Wordle-v0"), wordle, "own-bug", str(PROGRAM_BUG_EXIT))
    assert own.status == "env_error" and "my config file is missing" in own.error
    other = run(tmp_path, toolgym.make("Wordle-v0"), wordle, "own-bug", "3")
    assert other.status == "tool_crash"
    agent = scripted_agent(tiny_tokenizer(), ["x<|im_end|>"])
    missing = command_program([str(tmp_path / "no-such-program")])
    (absent,) = agent.run([toolgym.make("Wordle-v0")], wordle, rollout_fn=program_rollout(missing))
    assert absent.status == "env_error" and "could not be started" in absent.error
    pid_file = tmp_path / "pid"
    hung = run(tmp_path, toolgym.make("Wordle-v0"), wordle, "hang", str(pid_file), timeout=3)
    assert hung.status == "tool_timeout"
    _assert_gone(int(pid_file.read_text()))


def test_an_engine_failure_is_the_engine_s_even_when_the_program_fails_on_it(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    tokenizer = tiny_tokenizer()
    agent = Agent(
        ScriptedEngine(lambda prompt: 1 / 0), tokenizer, parser="hermes", limits=AgentLimits()
    )
    program = command_program([sys.executable, str(script), "5"])
    (played,) = agent.run(
        [toolgym.make("Arithmetic-v0")], [ADD], rollout_fn=program_rollout(program)
    )
    assert played.status == "engine_error", played.error


@needs_bwrap
def test_a_sandboxed_command_reaches_the_endpoint_at_its_usual_address(tmp_path):
    right = run(tmp_path, toolgym.make("Arithmetic-v0"), [ADD], "5", sandbox="process")
    wrong = run(tmp_path, toolgym.make("Arithmetic-v0"), [ADD], "6", sandbox="process")
    assert (right.status, right.reward, wrong.reward) == ("finished", 1.0, 0.0), right.error
    assert right.completion_ids == ids(tiny_tokenizer(), "42<|im_end|>")


@needs_bwrap
def test_a_sandboxed_command_reaches_nothing_else(tmp_path):
    """What the program (and any code it runs) reaches, from its own report: unsandboxed,
    everything its user may; sandboxed, no other host loopback service, no host file outside
    its view (`/etc/passwd`, a file beside its script), no write outside its private /tmp."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    service = socket.create_server(("127.0.0.1", 0))
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    beside = tmp_path / "planted.py"
    walls = {"port": service.getsockname()[1], "secret": str(secret), "beside": str(beside)}
    reports = {}
    try:
        for sandbox in (None, "process"):
            seen: list[str] = []

            class Keeper:
                def final_answer(self, text, seen=seen):
                    seen.append(text)

            program = command_program(
                [sys.executable, str(script), "walls"],
                env={"WALLS": json.dumps(walls)},
                sandbox=sandbox,
            )
            asyncio.run(program("http://127.0.0.1:59999/v1", "key", {"prompt": []}, Keeper()))
            reports[sandbox] = json.loads(seen[0])
    finally:
        service.close()
    print(reports)
    assert set(reports[None].values()) == {"reached"}
    assert reports["process"] == {
        "host loopback": "ConnectionRefusedError",
        "host accounts": "FileNotFoundError",
        "a file beside the program": "FileNotFoundError",
        "write beside the program": reports["process"]["write beside the program"],
        "write /tmp": "reached",
    }
    assert reports["process"]["write beside the program"] in ("OSError", "PermissionError")
    beside.unlink()  # only the unsandboxed run wrote it
    os.unlink("/tmp/scratch")  # and the host's /tmp/scratch (a sandbox's /tmp is its own)


def _assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the hung program was left running"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
