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
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
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
