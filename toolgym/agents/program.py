"""Agent programs as rollouts: train an agent as it is written, against the OpenAI API.

    async def my_agent(base_url, api_key, row, env):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        ...                              # the program's own loop, calling env's tools
        return None                      # the environment's reward counts

    agent.run(envs, rows, rollout_fn=program_rollout(my_agent))    # or GRPOTrainer(...)

The program gets the row with its `prompt` as chat messages (reset's observation appended, as
toolgym shows it) and the environment, reset. Each episode gets a session of an `Endpoint`
over the agent's own engine, tokenizer, parser, template and limits (one endpoint per agent,
started at first use, on loopback); what the session records is the episode's trajectory,
token for token. Requests that set no temperature or top-p sample at the run's own (the
trainer's temperature; greedy in `GRPOTrainer.evaluate()`'s default).

Only the environment writes rewards: the reward is the environment's `get_reward()` (and
reward functions, in training), graded from the calls and the answer the program handed it.
A Python program may return a score of its own instead: it is the trainer's own code, in the
trainer's process, where the model's text is data; a score must be a finite number of at most
`toolgym.envs.calls.MAX_REWARD` in size (else the episode ends `env_error`, naming it), and a
program must never compute it from what the model says about itself.

Whose a failure is (the rule of `toolgym.envs.stepping.failure_status`): a program handles the
model's text from start to end, so a program that raises, or a command that exits non-zero,
is the model's doing (`tool_crash`, in the loss with `AgentLimits.model_failure_reward`),
unless it marks the failure its own: a Python program raises `toolgym.EnvironmentBug`, a
command exits with status 70 (`PROGRAM_BUG_EXIT`, sysexits' EX_SOFTWARE); that, a command
that cannot start, and an engine that failed a request end `env_error` / `engine_error`,
outside the loss. A request past the limits gets an OpenAI-style error the program sees, and
the episode ends `max_turns` / `length`; a program that runs past `timeout` ends
`tool_timeout` (its calls decide how long it runs).

A program on the command line (any language, any agent library) is `command_program(argv)`:

    agent.run(envs, rows, rollout_fn=program_rollout(command_program(["node", "agent.js"])))

It runs with an environment of its own, not the trainer's (no API keys or tokens of the host):
PATH, HOME and LANG, `OPENAI_BASE_URL` and `OPENAI_API_KEY` (the episode's session),
`TOOLGYM_ROW` (the row as JSON, also on its stdin), and what `env=` adds. The last line it
prints is its answer, handed to the environment's `final_answer` to grade: a program reports
answers, never rewards (a line `reward: 1` is an answer like any other). Past `timeout`, its
process group is killed. `sandbox="process"` runs it in bubblewrap, reaching only the endpoint
(`toolgym.agents.program_sandbox`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, cast

from toolgym.agents.custom import EpisodeEnd, RolloutContext, RolloutFn
from toolgym.agents.endpoint import Endpoint
from toolgym.agents.trajectory import Trajectory
from toolgym.envs.calls import EnvironmentBug, EpisodeFailure, InvalidReward, as_reward
from toolgym.envs.stepping import failure_status
from toolgym.envs.time_limits import CallTimedOut, within
from toolgym.sandbox.remote import SandboxError

Program = Callable[[str, str, dict[str, Any], Any], Awaitable[float | None]]
"""`async def program(base_url, api_key, row, env) -> float | None`."""

PROGRAM_BUG_EXIT = 70
"""The exit status by which a command program says a failure is its own (sysexits.h's
EX_SOFTWARE): the episode ends `env_error`, outside the loss. Any other non-zero status is
the model's doing (`tool_crash`)."""

PASSED_VARIABLES = ("PATH", "HOME", "LANG")
"""The trainer's environment variables a command program gets (besides its own)."""

OUTPUT_KEPT = 64 << 10
"""Bytes of a command's stdout (its last line is the answer) and stderr (for the error) kept;
the rest is read and dropped, so a program that prints without end costs no memory."""

_endpoints: dict[int, Endpoint] = {}
_lock = threading.Lock()  # held while an agent's endpoint starts; `_close` never takes it
_log = logging.getLogger(__name__)


def program_rollout(program: Program, timeout: float = 600.0) -> RolloutFn:
    """A rollout function that plays each episode by running `program` against an
    OpenAI-compatible endpoint (see the module docstring)."""

    async def rollout(ctx: RolloutContext, env: Any) -> Trajectory:
        endpoint = await asyncio.to_thread(_endpoint_for, ctx)
        sampling = ctx.sampling  # this run's temperature (greedy in an evaluation)
        key = endpoint.open_session(sampling.temperature, sampling.top_p)
        failure: EpisodeEnd | None = None
        reward = None
        try:
            row = {**ctx.row, "prompt": list(ctx.messages)}  # reset's observation included
            reward = await within(program(endpoint.base_url, key, row, env), timeout, "the program")
            reward = as_reward(reward, "the program")
        except CallTimedOut as error:
            failure = EpisodeEnd("tool_timeout", str(error))
        except InvalidReward as error:  # the program's own code: its bug, not the model's
            failure = EpisodeEnd("env_error", str(error))
        except Exception as error:
            failure = EpisodeEnd(_program_status(error), f"the program failed: {error!r}")
        finally:
            trajectory = endpoint.close_session(key)
            ctx.adopt(trajectory, int(trajectory.metrics.get("turns", 0)))
        if trajectory.status in ("max_turns", "length", "engine_error"):  # the endpoint's word
            raise EpisodeEnd(trajectory.status, trajectory.error)
        if failure is not None:
            raise failure
        if reward is not None:
            ctx.reward = reward
        return trajectory

    return rollout


def _program_status(error: Exception) -> Literal["tool_timeout", "tool_crash", "env_error"]:
    """A failing program is the model's (`tool_crash`) unless it says otherwise
    (`EnvironmentBug`); an error the environment or its sandbox classified already (an
    `EpisodeFailure`: a worker that never started, a call that killed its worker) keeps that
    classification (`failure_status`)."""
    if isinstance(error, EpisodeFailure):
        return cast(Literal["tool_timeout", "tool_crash", "env_error"], failure_status(error))
    return "tool_crash"


def command_program(
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    sandbox: Literal["process"] | None = None,
    paths: Sequence[str] = (),
) -> Program:
    """A `Program` that runs `argv` as a process per episode (see the module docstring).

    Args:
        argv: The command line.
        cwd: Its working folder (default: this process's).
        env: Variables added to its minimal environment.
        sandbox: "process" to run it in bubblewrap (`toolgym.agents.program_sandbox`), with
            only the endpoint reachable; None (default) to run it as this process's user.
        paths: Folders a sandboxed program reads besides the files its command line names
            and `cwd` (its code, its packages).
    """
    argv = [str(part) for part in argv]
    if not argv:
        raise ValueError("command_program needs a command")
    if sandbox not in (None, "process"):
        raise ValueError(f'command_program: sandbox must be None or "process", not {sandbox!r}')
    if paths and sandbox is None:
        raise ValueError('command_program: paths= is for sandbox="process"')
    from toolgym.agents.program_sandbox import ProgramSandbox

    walls = ProgramSandbox(paths) if sandbox == "process" else None
    warned: list[bool] = []

    async def run(base_url: str, api_key: str, row: dict[str, Any], environment: Any) -> Any:
        text = json.dumps(row, default=str)
        variables = {name: os.environ[name] for name in PASSED_VARIABLES if name in os.environ}
        variables |= env or {}
        variables |= {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "TOOLGYM_ROW": text}
        if walls is None:
            out, err, status = await _run(argv, variables, cwd, text, None)
        else:
            variables["HOME"] = "/tmp"  # the sandbox's own
            try:
                async with walls.launch(argv, cwd, base_url) as (command, prepare):
                    out, err, status = await _run(command, variables, None, text, prepare)
            except (SandboxError, OSError, ValueError) as error:  # no sandbox could be made
                raise EnvironmentBug(f"the program's sandbox failed: {error}") from error
        if status != 0:
            tail = err.decode(errors="replace").strip()[-500:]
            why = f"{argv[0]} exited with status {status}: {tail}"
            raise EnvironmentBug(why) if status == PROGRAM_BUG_EXIT else RuntimeError(why)
        answer = _last_line(out, argv[0], warned)
        if answer:
            await asyncio.to_thread(environment.final_answer, answer)
        return None

    return run


def _last_line(out: bytes, program: str, warned: list[bool]) -> str:
    """The program's answer: its last non-empty line. One that looks like the old reward
    line is an answer too, said once in the log (`warned`)."""
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    answer = lines[-1].strip() if lines else ""
    if answer.startswith("reward:") and not warned:
        warned.append(True)
        _log.warning(
            "%s printed a last line %r: programs report answers, never rewards (issue 43); "
            "it goes to the environment's final_answer as an answer",
            program,
            answer[:40],
        )
    return answer


async def _run(
    command: list[str],
    variables: dict[str, str],
    cwd: str | None,
    stdin: str,
    prepare: Callable[[], None] | None,
) -> tuple[bytes, bytes, int]:
    """Run `command` to its end: the ends of its stdout and stderr, and its exit status. A
    command that cannot start is the program's own failure (`EnvironmentBug`); cancelled (the
    timeout, or the run stopping), its process group is killed."""
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=variables,
            start_new_session=True,  # killed whole when the episode ends early
            preexec_fn=prepare,
        )
    except (OSError, ValueError) as error:
        raise EnvironmentBug(f"{command[0]} could not be started: {error}") from error
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    try:
        feeding = asyncio.create_task(_feed(process.stdin, stdin.encode()))
        out, err, _ = await asyncio.gather(_tail(process.stdout), _tail(process.stderr), feeding)
        return out, err, await process.wait()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    """The row on stdin, then end of input (a program that does not read it is fine)."""
    with contextlib.suppress(OSError):
        stream.write(data)
        await stream.drain()
    with contextlib.suppress(OSError):
        stream.close()


async def _tail(stream: asyncio.StreamReader) -> bytes:
    """A stream read to its end, keeping its last `OUTPUT_KEPT` bytes."""
    kept = b""
    while chunk := await stream.read(1 << 16):
        kept = (kept + chunk)[-OUTPUT_KEPT:]
    return kept


def _endpoint_for(ctx: RolloutContext) -> Endpoint:
    """The endpoint over the context's agent (one per agent, closed when the agent goes)."""
    agent = ctx.agent
    with _lock:
        endpoint = _endpoints.get(id(agent))
        if endpoint is None:
            endpoint = Endpoint(
                agent.engine,
                agent.tokenizer,
                parser=agent.parse,
                limits=ctx.limits,
                chat_template=agent.chat_template,
                chat_template_kwargs=agent.chat_template_kwargs,
            )
            endpoint.start()
            _endpoints[id(agent)] = endpoint
            weakref.finalize(agent, _close, id(agent))
        return endpoint


def _close(agent_id: int) -> None:
    """An agent's finalizer: stop its endpoint, taking no lock and waiting for nothing.

    The collector runs it in whatever thread allocated at the time: often the server thread of
    a new endpoint that `_endpoint_for` is starting under `_lock` (taking the lock there kept
    that server from ever starting), or the old endpoint's own server thread (which cannot join
    itself). So the entry is dropped at once (a dict pop is atomic) and the close, which waits
    for the server thread, runs in a thread of its own."""
    endpoint = _endpoints.pop(agent_id, None)
    if endpoint is not None:
        threading.Thread(target=endpoint.close, name="toolgym-endpoint-close", daemon=True).start()
