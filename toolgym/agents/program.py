"""Agent programs as rollouts: train an agent as it is written, against the OpenAI API.

    async def my_agent(base_url, api_key, row, env):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        ...                              # the program's own loop, calling env's tools
        return None                      # or a score of its own

    agent.run(envs, rows, rollout_fn=program_rollout(my_agent))    # or GRPOTrainer(...)

The program gets the row with its `prompt` as chat messages (reset's observation appended, as
toolgym shows it) and the environment, reset. Each episode gets a session of an `Endpoint`
over the agent's own engine, tokenizer, parser, template and limits (one endpoint per agent,
started at first use, on loopback); what the session records is the episode's trajectory,
token for token. Requests that set no temperature or top-p sample at the run's own (the
trainer's temperature; greedy in `GRPOTrainer.evaluate()`'s default). The reward is the
program's return value, else the environment's `get_reward()` (and reward functions, in
training). A request past the limits gets an OpenAI-style error the program sees, and the
episode ends `max_turns` / `length`; a program that raises ends `env_error`, one that runs past
`timeout` ends `tool_timeout` (the model's outcome: its calls decide how long the program
runs).

A program on the command line (any language, any agent library) is `command_program(argv)`:

    agent.run(envs, rows, rollout_fn=program_rollout(command_program(["node", "agent.js"])))

It runs with `OPENAI_BASE_URL` and `OPENAI_API_KEY` (the episode's session) and `TOOLGYM_ROW`
(the row as JSON, also on its stdin) in its environment. The last line it prints is its
answer: `reward: <number>` is the reward; other text is handed to the environment's
`final_answer` (which grades it), so the environment's reward counts. A non-zero exit ends the
episode `env_error` with the end of its stderr; past `timeout`, its process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolgym.agents.custom import EpisodeEnd, RolloutContext, RolloutFn
from toolgym.agents.endpoint import Endpoint
from toolgym.agents.trajectory import Trajectory

Program = Callable[[str, str, dict[str, Any], Any], Awaitable[float | None]]
"""`async def program(base_url, api_key, row, env) -> float | None`."""

_endpoints: dict[int, Endpoint] = {}
_lock = threading.Lock()


def program_rollout(program: Program, timeout: float = 600.0) -> RolloutFn:
    """A rollout function that plays each episode by running `program` against an
    OpenAI-compatible endpoint (see the module docstring)."""

    async def rollout(ctx: RolloutContext, env: Any) -> Trajectory:
        endpoint = await asyncio.to_thread(_endpoint_for, ctx)
        sampling = ctx._episode.sampling  # this run's temperature (greedy in an evaluation)
        key = endpoint.open_session(sampling.temperature, sampling.top_p)
        failure: EpisodeEnd | None = None
        try:
            row = {**ctx.row, "prompt": list(ctx.messages)}  # reset's observation included
            reward = await asyncio.wait_for(program(endpoint.base_url, key, row, env), timeout)
        except TimeoutError:
            failure = EpisodeEnd("tool_timeout", f"the program ran past {timeout:g} s")
        except Exception as error:
            failure = EpisodeEnd("env_error", f"the program failed: {error!r}")
        finally:
            trajectory = endpoint.close_session(key)
            ctx.adopt(trajectory, int(trajectory.metrics.get("turns", 0)))
        if trajectory.status in ("max_turns", "length"):  # a limit refused a request
            raise EpisodeEnd(trajectory.status, trajectory.error)
        if failure is not None:
            raise failure
        if reward is not None:
            ctx.reward = reward
        return trajectory

    return rollout


def command_program(
    argv: Sequence[str], *, cwd: str | None = None, env: dict[str, str] | None = None
) -> Program:
    """A `Program` that runs `argv` as a process per episode (see the module docstring);
    `env` adds variables to its environment, `cwd` is its working folder."""
    argv = [str(part) for part in argv]
    if not argv:
        raise ValueError("command_program needs a command")

    async def run(base_url: str, api_key: str, row: dict[str, Any], environment: Any) -> Any:
        text = json.dumps(row, default=str)
        variables = {**os.environ, **(env or {})}
        variables |= {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "TOOLGYM_ROW": text}
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=variables,
            start_new_session=True,  # killed whole when the episode ends early
        )
        try:
            out, err = await process.communicate(text.encode())
        finally:
            if process.returncode is None:  # cancelled: the timeout, or the run stopping
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if process.returncode != 0:
            tail = err.decode(errors="replace").strip()[-500:]
            raise RuntimeError(f"{argv[0]} exited with status {process.returncode}: {tail}")
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        answer = lines[-1].strip() if lines else ""
        if answer.startswith("reward:"):
            return float(answer.removeprefix("reward:"))
        if answer:
            await asyncio.to_thread(environment.final_answer, answer)
        return None

    return run


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
    with _lock:
        endpoint = _endpoints.pop(agent_id, None)
    if endpoint is not None:
        endpoint.close()
