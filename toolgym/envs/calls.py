"""What crosses an environment's door: tool calls, their results, and one step's outcome.

`PreparedCall` runs a checked call and turns whatever happens into a `ToolResult` the model
can read; it is the one place a tool's return value or exception becomes message text, for
local environments and inside sandbox workers alike. Standard library only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import math
import numbers
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from toolgym.envs.tools import (
    UnrenderableResult,
    blocks_text,
    image_blocks,
    render_result,
    render_trl_error,
    render_trl_result,
)

logger = logging.getLogger(__name__)

FailureKind = Literal[
    "malformed",
    "unknown_tool",
    "invalid_arguments",
    "tool_error",
    "tool_exception",
    "bad_result",
    "episode_over",
    # a call the executor could not finish; each ends the episode (`Stepper.ended`) and is
    # also the episode's status (`toolgym.agents.trajectory.Status`):
    "tool_timeout",  # past its own or its turn's time limit: the model's outcome
    "tool_crash",  # the model's call killed or crippled its sandbox worker: the model's outcome
    "env_error",  # the executor failed for a reason the model cannot cause
]

INVALID_CALLS: frozenset[str] = frozenset({"malformed", "unknown_tool", "invalid_arguments"})
"""The failures of calls refused before any tool ran: the model wrote the call wrong
(`AgentLimits.invalid_call_reward` is the step reward of each)."""

EPISODE_OVER = "the episode is over"
"""What a call after the end of its episode is told (`episode_over`): the environment graded
already, and nothing after the end reaches it."""


class ToolError(Exception):
    """Raise from a tool to tell the model it made a mistake; the message is shown as is.

    Any other exception is reported as a crash of the tool (`tool_exception`) with its type.
    """


class EpisodeFailure(Exception):
    """A failure that ends an episode, typed by whose doing it is: the one hierarchy every
    layer reads (`toolgym.envs.stepping.failure_status` turns it into the episode's status).

    - `ModelFailure`: the model's doing (its call crashed or killed what ran it, or ran past
      its time): `tool_crash`, or `tool_timeout` for one that is also a `TimeoutError`; in
      the loss.
    - `EnvironmentFailure`: the environment's own (`EnvironmentBug`): `env_error`, left out of
      baselines and the loss.
    - `InfrastructureFailure`: an environment failure known to be the infrastructure's
      whatever the call was doing (a lost node or Ray actor): `env_error`, never the model's.

    An `EpisodeFailure` of none of the three (a sandbox failure not traced to the model's
    call, such as a worker that never started) is the environment's too.
    """


class ModelFailure(EpisodeFailure):
    """The model's doing: in the loss (`tool_crash`; `tool_timeout` if also a TimeoutError)."""


class EnvironmentFailure(EpisodeFailure):
    """The environment's own failure: `env_error`, left out of the loss."""


class InfrastructureFailure(EnvironmentFailure):
    """The infrastructure's failure whatever the call was doing (a lost node or actor)."""


class EnvironmentBug(EnvironmentFailure):
    """Raise from an environment's code to say a failure is its own, not the model's: the
    episode ends `env_error` and leaves the loss (as an infrastructure failure does).

    The rule it marks the exception to: whatever an environment raises while it handles one
    of the model's calls (a tool, `inline_step`, `final_answer`) is the model's doing, since
    the model chose the input. A tool's exception is shown to the model (`tool_exception`) and
    the episode goes on; an exception in `inline_step` or `final_answer` ends the episode
    `tool_crash` (`ModelCausedError`), in the loss with `AgentLimits.model_failure_reward`.
    Only this class (and subclasses) says otherwise.
    """


class ModelCausedError(ModelFailure, RuntimeError):
    """The environment's code raised while it handled the model's text (`inline_step`,
    `final_answer`) and did not mark the failure its own (`EnvironmentBug`): the episode ends
    `tool_crash`, the model's outcome. Carries the original exception as its cause. (A
    sandbox's host side gets this class's name back from a worker.)"""


MAX_REWARD = 1e6
"""The largest reward magnitude toolgym takes from a program or hook that reports one
(`as_reward`): past it, a group's statistics in float32 lose the other rewards (1e300 would
overflow them), and no reward scale needs it."""


class InvalidReward(ValueError):
    """A reported reward that is not a finite number of at most `MAX_REWARD` in size."""


def as_reward(value: Any, source: str) -> float | None:
    """A reported reward checked: None ("no reward") or a real number, finite and of at most
    `MAX_REWARD` in size, as a float; anything else raises `InvalidReward` naming `source`
    and the value (never a silent NaN, infinity or 1e300)."""
    if value is None:
        return None
    if not isinstance(value, numbers.Real):
        raise InvalidReward(f"{source} gave a reward of type {type(value).__name__}, not a number")
    try:
        reward = float(value)
    except OverflowError:  # an int past float's range
        reward = float("inf")
    if not math.isfinite(reward) or abs(reward) > MAX_REWARD:
        raise InvalidReward(
            f"{source} gave a reward of {reward:g}: a reward must be a finite number of at "
            f"most {MAX_REWARD:g} in size"
        )
    return reward


@dataclass
class ToolCall:
    """A call the model asked for. `arguments` may be a dict or a JSON string."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass
class MalformedToolCall:
    """Text that looked like a tool call but could not be parsed; answered with an error."""

    text: str
    reason: str
    id: str | None = None


@dataclass
class ToolResult:
    """The outcome of one call: the content shown to the model, and whether it failed."""

    call: ToolCall | MalformedToolCall
    content: str
    failure: FailureKind | None = None
    blocks: list[dict[str, str]] | None = None
    """A result with images: its text and image blocks in order (`tools.image_blocks`);
    `content` is then its text."""

    @property
    def ok(self) -> bool:
        """True unless the call failed."""
        return self.failure is None

    @property
    def message(self) -> dict[str, Any]:
        """The chat message (`role: tool`) that carries this result back to the model."""
        name = self.call.name if isinstance(self.call, ToolCall) else "invalid_tool_call"
        message: dict[str, Any] = {"role": "tool", "name": name, "content": self.content}
        if self.blocks:  # the agent renders them where its model sees images
            message["content_blocks"] = self.blocks
        if self.call.id is not None:
            message["tool_call_id"] = self.call.id
        return message


@dataclass
class StepResult:
    """What one turn of tool calls produced.

    Attributes:
        messages: One `role: tool` message per call, in call order.
        reward: Reward earned during this step (the change of `get_reward()`).
        terminated: The environment ended the episode (`done`).
        truncated: The episode hit the environment's `max_turns` without ending.
        info: `turn`, `tool_calls`, `tool_failures` and `failures` (kind and message per failure).
    """

    messages: list[dict[str, Any]]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    results: list[ToolResult] = field(default_factory=list, repr=False)


AnyToolCall = ToolCall | MalformedToolCall | Mapping[str, Any]

Demonstration = list[list[ToolCall]] | list[str]
"""An expert's episode: its tool calls, one list per turn; or, for inline environments, the
pieces of text it writes, each ending with a marker."""


@dataclass
class PreparedCall:
    """A checked call, bound to its environment's method; running it raises only
    `EnvironmentBug` (the environment says the failure is its own) and `UnrenderableResult`
    (media content): any other exception is the tool's failure the model reads
    (`tool_exception`), a result that is no JSON a `bad_result`."""

    call: ToolCall
    function: Callable[..., Any]
    arguments: dict[str, Any]
    trl_text: bool = False
    """Render as TRL renders a tool's outcome (a class written for TRL's environment_factory,
    or plain tool functions): `str(value)`, and `str({"error": str(exception)})` for a tool
    that raised (`render_trl_result`)."""

    def run(self) -> ToolResult:
        """Call the tool (a coroutine is run to completion) and render its outcome."""
        try:
            value = self.function(**self.arguments)
            if inspect.iscoroutine(value):
                value = run_coroutine(value)
        except EnvironmentBug:
            raise  # the environment's own failure: the episode ends env_error
        except Exception as error:
            return self._failed(error)
        return self._rendered(value)

    async def arun(self) -> ToolResult:
        """`run` for an event loop: async tools are awaited, sync ones run in a thread."""
        try:
            if inspect.iscoroutinefunction(self.function):
                value = await self.function(**self.arguments)
            else:
                value = await asyncio.to_thread(self.function, **self.arguments)
        except EnvironmentBug:
            raise
        except Exception as error:
            return self._failed(error)
        return self._rendered(value)

    def _failed(self, error: Exception) -> ToolResult:
        if self.trl_text:
            text = render_trl_error(str(error))
            if isinstance(error, ToolError):
                return ToolResult(self.call, text, "tool_error")
            return ToolResult(self.call, text, "tool_exception")
        if isinstance(error, ToolError):
            return ToolResult(self.call, f"Error: {error}", "tool_error")
        name = self.call.name
        return ToolResult(
            self.call, f"Error: {name} raised {type(error).__name__}: {error}", "tool_exception"
        )

    def _rendered(self, value: Any) -> ToolResult:
        try:
            blocks = image_blocks(value)
            if blocks is not None:
                return ToolResult(self.call, blocks_text(blocks), blocks=blocks)
            if self.trl_text:
                return ToolResult(self.call, render_trl_result(value))
            return ToolResult(self.call, render_result(value))
        except UnrenderableResult:
            raise  # not the model's error to read: the episode ends, naming it
        except (TypeError, ValueError, RecursionError) as error:
            return ToolResult(self.call, f"Error: {self.call.name} failed: {error}.", "bad_result")


def as_episode_metrics(value: Any) -> dict[str, float]:
    """An environment's `episode_metrics()` answer checked: a mapping of names to finite
    numbers (None is no metrics); anything else raises ValueError naming what is wrong."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"episode_metrics() must return a dict of numbers, not {value!r}")
    metrics = {}
    for name, number in value.items():
        if not isinstance(name, str) or not isinstance(number, int | float):
            raise ValueError(f"episode metric {name!r}: {number!r} is not a number")
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError(f"episode metric {name!r} is {number}, not a finite number")
        metrics[name] = float(number)
    return metrics


def accepted_kwargs(function: Callable[..., Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A filter that keeps only the keyword arguments `function` accepts (all, with **kwargs)."""
    params = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return lambda kwargs: kwargs
    names = {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return lambda kwargs: {k: v for k, v in kwargs.items() if k in names}


def as_call_list(
    tool_calls: AnyToolCall | Iterable[AnyToolCall],
) -> list[ToolCall | MalformedToolCall]:
    """One call or many, as ToolCall objects or OpenAI-style dicts -> a list of calls."""
    if isinstance(tool_calls, (ToolCall, MalformedToolCall, Mapping)):
        tool_calls = [tool_calls]
    return [_as_call(call) for call in tool_calls]


def tool_call_from_dict(data: Any, text: str | None = None) -> ToolCall | MalformedToolCall:
    """A decoded `{"name": ..., "arguments": {...}}` -> a call, or why not.

    `text` is what the model wrote, kept in a MalformedToolCall (default: `data` as JSON).
    """
    call = _as_call(data) if isinstance(data, Mapping) else None
    if isinstance(call, ToolCall):
        return call
    reason = call.reason if call is not None else 'expected {"name": ..., "arguments": {...}}'
    return MalformedToolCall(text if text is not None else json.dumps(data, default=str), reason)


def _as_call(call: AnyToolCall) -> ToolCall | MalformedToolCall:
    """Accept ToolCall objects and OpenAI-style dicts (`{"function": {"name", "arguments"}}`)."""
    if isinstance(call, (ToolCall, MalformedToolCall)):
        return call
    if isinstance(call, Mapping):
        body = call.get("function", call)
        name = body.get("name") if isinstance(body, Mapping) else None
        if isinstance(name, str) and name:
            arguments = body.get("arguments", body.get("parameters", {}))
            return ToolCall(name, arguments, call.get("id"))
    return MalformedToolCall(repr(call), "a tool call needs a 'name' and 'arguments'")


def close_all(envs: Iterable[Any]) -> None:
    """Close every environment that has `close()` (sandboxes and containers stop), even when
    some fail to: each failure is logged, none stops the others."""
    for env in envs:
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                logger.warning("closing %r failed", env, exc_info=True)


def run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine from sync code, also when the caller is inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
