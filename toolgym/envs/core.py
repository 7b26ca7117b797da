"""The environment protocol: `Environment`, the messages that cross its door, and `step()`.

An environment is one episode's worth of state. `reset(**row)` starts an episode from a dataset
row; every public method is a tool the model may call; `step(tool_calls)` runs the calls the
model made in one turn and answers with tool messages. Whatever the model sends, `step` answers
with a message: a wrong call is an error message the model can read, counted in `info`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import logging
import os
import random
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from toolgym.envs.tools import (
    Tool,
    ToolArgumentError,
    collect_tools,
    decode_arguments,
    render_result,
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
]


# Set by toolgym.sandbox.worker: tool schemas (which need pydantic and transformers) are built
# on the host only.
_IN_SANDBOX_WORKER = os.environ.get("TOOLGYM_WORKER") == "1"


class ToolError(Exception):
    """Raise from a tool to tell the model it made a mistake; the message is shown as is.

    Any other exception is reported as a crash of the tool (`tool_exception`) with its type.
    """


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

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def message(self) -> dict[str, Any]:
        """The chat message (`role: tool`) that carries this result back to the model."""
        name = self.call.name if isinstance(self.call, ToolCall) else "invalid_tool_call"
        message = {"role": "tool", "name": name, "content": self.content}
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


class Environment:
    """Base class for toolgym environments; one instance per rollout.

    Subclass it, implement `reset(**row)` and write tools as public methods with type hints and
    a Google-style docstring. Set `self.reward` and `self.done` from the tools; read `self.rng`
    for randomness so that two instances reset with the same seed behave the same.

    Attributes:
        reward: The episode's reward so far (set it from the tools).
        done: True once the episode is over (the environment says so).
        max_turns: Turns (assistant messages with tool calls) before the episode is truncated;
            None for no limit of the environment's own.
        turn: Turns taken in this episode.
        rng: A `random.Random` seeded by `reset(seed=...)`.
    """

    reward: float = 0.0
    done: bool = False
    max_turns: int | None = None
    turn: int = 0

    _tools: ClassVar[dict[str, Tool]] = {}
    _episode_started: bool = False
    _truncated: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "reset" in cls.__dict__:
            cls.reset = _with_episode_start(cls.__dict__["reset"])  # type: ignore[method-assign]
        if not _IN_SANDBOX_WORKER:  # the host validates calls; the worker only runs them
            cls._tools = collect_tools(cls, exclude=BASE_API)

    # -- episode ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None, **kwargs: Any) -> str | None:
        """Start an episode from a dataset row's columns; a returned string is shown first.

        Subclasses override this with the columns they need (extra columns are not passed
        to them) and do not need to call `super().reset()`: the seed, `reward`, `done` and
        `turn` are reset before the override runs.
        """
        self._start_episode(seed)
        return None

    def close(self) -> None:
        """Release what the environment holds (processes, files); called once at the end."""

    def get_reward(self) -> float:
        """The episode's reward so far."""
        return float(self.reward)

    def final_answer(self, text: str) -> None:
        """Called with the model's last message when it answers without calling a tool.

        Environments that grade a final answer (rather than a tool call) override this and
        set `reward` / `done`. The default ignores the text.
        """

    def demonstration(self) -> list[list[ToolCall]] | None:
        """An expert's tool calls for the current episode, one list per turn (for SFT warm-up).

        Called right after `reset`; it must not change the episode's state. The default has
        no expert and returns None.
        """
        return None

    @property
    def rng(self) -> random.Random:
        if "_rng" not in self.__dict__:
            self._rng = random.Random()
        return self._rng

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas in the OpenAI function-calling format."""
        return [tool.schema for tool in self._tool_table().values()]

    @property
    def truncated(self) -> bool:
        return self._truncated

    # -- stepping --------------------------------------------------------------------------
    def step(self, tool_calls: AnyToolCall | Iterable[AnyToolCall]) -> StepResult:
        """Run one turn's tool calls in order and answer each with a tool message."""
        calls, reward_before = self._begin_step(tool_calls)
        results = []
        for call in calls:
            prepared = self._prepare_call(call)
            results.append(prepared if isinstance(prepared, ToolResult) else prepared.run())
        return self._end_step(results, reward_before)

    async def astep(self, tool_calls: AnyToolCall | Iterable[AnyToolCall]) -> StepResult:
        """Like `step`, without blocking the event loop: sync tools run in a worker thread."""
        calls, reward_before = self._begin_step(tool_calls)
        results = []
        for call in calls:
            prepared = self._prepare_call(call)
            results.append(prepared if isinstance(prepared, ToolResult) else await prepared.arun())
        return self._end_step(results, reward_before)

    # -- internals shared with the adapter --------------------------------------------------
    def _tool_table(self) -> dict[str, Tool]:
        return type(self)._tools

    def _tool_owner(self) -> object:
        return self

    def _is_over(self) -> bool:
        return bool(self.done) or self._truncated

    def _start_episode(self, seed: int | None) -> None:
        self._rng = random.Random(seed)
        self.reward = 0.0
        self.done = False
        self.turn = 0
        self._truncated = False
        self._episode_started = True

    def _begin_step(
        self, tool_calls: AnyToolCall | Iterable[AnyToolCall]
    ) -> tuple[list[ToolCall | MalformedToolCall], float]:
        if not self._episode_started:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step()")
        calls = _as_call_list(tool_calls)
        if not self._is_over():
            self.turn += 1
        return calls, self.get_reward()

    def _end_step(self, results: list[ToolResult], reward_before: float) -> StepResult:
        limit = self.max_turns
        if limit is not None and self.turn >= limit and not self.done:
            self._truncated = True
        failures = [r for r in results if not r.ok]
        info = {
            "turn": self.turn,
            "tool_calls": len(results),
            "tool_failures": len(failures),
            "failures": [{"kind": r.failure, "message": r.content} for r in failures],
        }
        return StepResult(
            messages=[r.message for r in results],
            reward=self.get_reward() - reward_before,
            terminated=bool(self.done),
            truncated=self._truncated,
            info=info,
            results=results,
        )

    def _prepare_call(self, call: ToolCall | MalformedToolCall) -> ToolResult | PreparedCall:
        """Check one call: an error result if it cannot run, else a call ready to run."""
        if isinstance(call, MalformedToolCall):
            return ToolResult(
                call, f"Error: could not parse the tool call: {call.reason}", "malformed"
            )
        if self._is_over():
            why = "the episode is over" if self.done else "the turn limit was reached"
            return ToolResult(
                call, f"Error: {why}; no more tool calls are accepted.", "episode_over"
            )
        table = self._tool_table()
        tool = table.get(call.name)
        if tool is None:
            available = ", ".join(t.signature for t in table.values()) or "none"
            return ToolResult(
                call,
                f"Error: unknown tool '{call.name}'. Available tools: {available}.",
                "unknown_tool",
            )
        try:
            arguments = tool.validate(decode_arguments(call.arguments))
        except ToolArgumentError as error:
            return ToolResult(
                call,
                f"Error: invalid arguments for {call.name}: {error}. Expected: {tool.signature}.",
                "invalid_arguments",
            )
        return PreparedCall(call, tool, tool.function.__get__(self._tool_owner()), arguments)


@dataclass
class PreparedCall:
    """A checked call, bound to its environment; running it never raises."""

    call: ToolCall
    tool: Tool | None  # None in a sandbox worker, which only runs calls the host checked
    function: Callable[..., Any]
    arguments: dict[str, Any]

    def run(self) -> ToolResult:
        try:
            value = self.function(**self.arguments)
            if inspect.iscoroutine(value):
                value = run_coroutine(value)
        except Exception as error:
            return self._failed(error)
        return self._rendered(value)

    async def arun(self) -> ToolResult:
        try:
            if self.tool.is_async:
                value = await self.function(**self.arguments)
            else:
                value = await asyncio.to_thread(self.function, **self.arguments)
        except Exception as error:
            return self._failed(error)
        return self._rendered(value)

    def _failed(self, error: Exception) -> ToolResult:
        if isinstance(error, ToolError):
            return ToolResult(self.call, f"Error: {error}", "tool_error")
        name = self.call.name
        return ToolResult(
            self.call, f"Error: {name} raised {type(error).__name__}: {error}", "tool_exception"
        )

    def _rendered(self, value: Any) -> ToolResult:
        try:
            return ToolResult(self.call, render_result(value))
        except (TypeError, ValueError, RecursionError) as error:
            return ToolResult(self.call, f"Error: {self.call.name} failed: {error}.", "bad_result")


# Names of the base API: never tools, whatever a subclass does with them.
BASE_API: set[str] = {name for name in dir(Environment) if not name.startswith("_")} | {
    "get_reward"
}


def _with_episode_start(reset: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a subclass's `reset` so that every episode starts seeded and clean."""
    pass_kwargs = accepted_kwargs(reset)

    @functools.wraps(reset)
    def reset_episode(self: Environment, seed: int | None = None, **row: Any) -> str | None:
        self._start_episode(seed)
        return reset(self, **pass_kwargs({**row, "seed": seed}))

    return reset_episode


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


def _as_call_list(
    tool_calls: AnyToolCall | Iterable[AnyToolCall],
) -> list[ToolCall | MalformedToolCall]:
    if isinstance(tool_calls, (ToolCall, MalformedToolCall, Mapping)):
        tool_calls = [tool_calls]
    return [_as_call(call) for call in tool_calls]


def tool_call_from_json(text: str) -> ToolCall | MalformedToolCall:
    """`{"name": ..., "arguments": {...}}` (or `"parameters"`) text -> a call, or why not."""
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError as error:
        return MalformedToolCall(text, f"invalid JSON ({error.msg} at position {error.pos})")
    except (ValueError, RecursionError) as error:  # digit limit, nesting past the stack
        return MalformedToolCall(text, f"unreadable JSON ({type(error).__name__})")
    return tool_call_from_dict(decoded, text)


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
