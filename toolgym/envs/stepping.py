"""Stepping: one object runs a turn's tool calls, wherever the environment lives.

`Stepper` owns what every environment shares: the tool table, argument checks, the episode's
state (`EpisodeState`: turns, truncation, the answer, a failure that ended it, the reward read
once), the error messages the model reads, `StepResult`, and the lifecycle (a context
manager). An *executor* owns where the environment's state lives and runs checked
calls there, through a small interface (`Executor`): `LocalExecutor` in this process, and the
sandbox room's `RemoteExecutor` in a worker process or a container.

    env = Stepper(LocalExecutor(MyPlainClass()))   # what `toolgym.as_environment` returns
    env.reset(seed=0, **row)
    env.step(ToolCall("guess", {"word": "crane"}))
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from copy import deepcopy
from typing import Any, Protocol

from toolgym.envs.calls import (
    EPISODE_OVER,
    AnyToolCall,
    Demonstration,
    EnvironmentBug,
    EnvironmentFailure,
    EpisodeFailure,
    FailureKind,
    MalformedToolCall,
    ModelCausedError,
    ModelFailure,
    PreparedCall,
    StepResult,
    ToolCall,
    ToolResult,
    accepted_kwargs,
    as_call_list,
    as_episode_metrics,
    run_coroutine,
)
from toolgym.envs.core import begin_episode
from toolgym.envs.episode_state import EpisodeState
from toolgym.envs.functions import function_tools, is_function_list
from toolgym.envs.inline import InlineStep, as_inline_step
from toolgym.envs.seeding import global_random_seeded, warn_if_unseedable
from toolgym.envs.snapshots import NotForkable, Snapshot, class_name, forked, restore_into, state_of
from toolgym.envs.time_limits import CallTimedOut, TimeLimits, within
from toolgym.envs.tools import (
    Tool,
    ToolArgumentError,
    decode_arguments,
    instance_tools,
    is_environment_class,
    marked_ends_episode,
    own_methods,
    tool_table,
)


class Steppable(Protocol):
    """The environment protocol: what `make` and `as_environment` return and the agent loop
    plays. A `Stepper` over any executor is one (an `Environment`, a plain class, a sandboxed
    instance), and so is any object that provides these.
    The hooks an environment may also have (`inline_markers`, `truncated`) are read where
    present (`toolgym.envs.hooks`)."""

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas in the OpenAI function-calling format."""
        ...

    @property
    def done(self) -> bool:
        """Whether the environment ended the episode."""
        ...

    def reset(self, seed: int | None = None, **row: Any) -> str | None:
        """Start an episode from a dataset row (and a seed); the first observation."""
        ...

    def step(self, tool_calls: AnyToolCall | Iterable[AnyToolCall]) -> StepResult:
        """Run one turn's tool calls and answer each with a tool message."""
        ...

    async def astep(
        self,
        tool_calls: AnyToolCall | Iterable[AnyToolCall],
        *,
        call_timeout: float | None = None,
        turn_timeout: float | None = None,
    ) -> StepResult:
        """`step` without blocking the event loop, with time limits for each call and for the
        turn's calls together (a call past either ends the episode `tool_timeout`)."""
        ...

    def get_reward(self) -> float | None:
        """The episode's reward (None: the environment gives none)."""
        ...

    def final_answer(self, text: str) -> None:
        """Hand the model's last message (an answer without tool calls) to the environment."""
        ...

    def user_turn(self, answer: str) -> str | None:
        """The user's next message after an answer without tool calls (None: no more)."""
        ...

    async def ainline_step(self, text: str) -> InlineStep:
        """The inline protocol's step on text the model wrote."""
        ...

    def demonstration(self) -> Demonstration | None:
        """An expert's episode (for a warm-up), or None."""
        ...

    def episode_metrics(self) -> dict[str, float]:
        """The episode's named figures besides its reward."""
        ...

    def close(self) -> None:
        """Release what the environment holds."""
        ...


class Executor(abc.ABC):
    """Where an environment's state lives, the one thing a `Stepper` steps. Every method but
    `reset` may be called only after `reset`; calls reach `run` / `arun` already checked
    against `tool_table()`.

    A subclass defines `reset`, `run`, `read_reward` and `close`, and sets `target` (the
    environment's class); the rest has defaults it overrides where its environment differs:
    `arun` runs `run` in a thread, tools are the class's (`tool_table(target)`), the episode
    never ends by itself (`done`), a final answer is ignored, the inline protocol is refused,
    and there is no expert and no metric."""

    target: type
    """The environment's class (its tools are `tool_table(target)` by default)."""
    max_turns: int | None = None
    """The environment's own turn limit (None: none)."""

    @abc.abstractmethod
    def reset(self, row: dict[str, Any]) -> str | None:
        """Start an episode from a row (its `seed` included); the first observation."""

    @abc.abstractmethod
    def run(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        """Run a checked call; its outcome as a result (a failing tool is a failed result)."""

    async def arun(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        """`run` without blocking the event loop (by default in a thread)."""
        return await asyncio.to_thread(self.run, call, arguments)

    @abc.abstractmethod
    def read_reward(self) -> float | None:
        """The episode's reward so far; None where the environment reports none."""

    def reward(self) -> float:
        """The reward as a number (by default None reads as 0.0)."""
        value = self.read_reward()
        return 0.0 if value is None else value

    def tool_table(self) -> dict[str, Tool]:
        """The tools the model sees, by name (by default the class's)."""
        return tool_table(self.target)

    def begin_episode(self) -> None:  # noqa: B027 (a default: nothing to forget)
        """Forget the last episode's end (the `Stepper` calls it at every reset)."""

    def done(self) -> bool:
        """Whether the environment ended the episode."""
        return False

    def final_answer(self, text: str) -> None:  # noqa: B027 (a default: no grader to hand it)
        """Hand the model's last message (no tool calls) to the environment to grade (by
        default nobody: reward functions grade it)."""

    def user_turn(self, answer: str) -> str | None:
        """The environment's next user message after an answer without tool calls (by
        default none: one user turn)."""
        return None

    def inline(self, text: str) -> InlineStep:
        """The environment's `inline_step` on text the model wrote (the inline protocol)."""
        raise TypeError(
            f"{type(self).__name__}: this environment speaks the chat tool-call protocol only"
        )

    def demonstration(self) -> Demonstration | None:
        """An expert's calls for this episode, one list per turn, or None."""
        return None

    def metrics(self) -> dict[str, float]:
        """The environment's `episode_metrics()`, checked (empty when it has none)."""
        return {}

    def snapshot(self) -> dict[str, Any]:
        """The episode's state as this executor keeps it (`toolgym.envs.snapshots`); the
        default says that where it lives cannot be copied yet."""
        raise NotForkable(f"{type(self).__name__}: {self._not_forkable}")

    def restore(self, state: dict[str, Any]) -> None:
        """Go back to a state `snapshot` returned."""
        raise NotForkable(f"{type(self).__name__}: {self._not_forkable}")

    def fork(self, n: int = 1) -> list[Executor]:
        """`n` independent executors, each over a copy of this one's environment,
        mid-episode."""
        raise NotForkable(f"{type(self).__name__}: {self._not_forkable}")

    _not_forkable = "environments that live here are not snapshotted or forked yet"

    @abc.abstractmethod
    def close(self) -> None:
        """Release the environment and what it holds."""


class LocalExecutor(Executor):
    """The environment instance in this process: an `Environment` or any object with
    `reset(**kwargs)` and public methods (TRL's `environment_factory` shape; `get_reward()` or
    a `reward` attribute, and an optional `done`)."""

    def __init__(self, instance: object) -> None:
        if not callable(getattr(instance, "reset", None)):
            raise TypeError(
                f"{type(instance).__name__} cannot be used as an environment: it has no reset() "
                "method. An environment needs reset(**kwargs) and public methods as tools."
            )
        self.instance: Any = instance  # any object with reset(**kwargs) and public methods
        self.target = type(instance)
        self._tools: tuple[dict[str, Tool], dict[str, Any], dict[str, Tool]] | None = None
        """(the class's table, the instance's own bound methods, the instance's table)."""
        self.answered = False
        """A tool marked `ends_episode` succeeded, or `final_answer` was given: the episode is
        over. With the instance's own `done`, it makes this executor refuse later calls (also
        inside a sandbox worker, which runs calls through a `LocalExecutor`): an environment
        grades once."""

    @property
    def max_turns(self) -> int | None:
        """The instance's `max_turns`, read live (its `reset` may set it)."""
        return getattr(self.instance, "max_turns", None)

    @max_turns.setter
    def max_turns(self, value: int | None) -> None:
        self.instance.max_turns = value

    def reset(self, row: dict[str, Any]) -> str | None:
        """Start the episode (`toolgym.envs.core.begin_episode`: an `Environment`'s `rng`
        seeded, its `reward` and any instance's `done` cleared), then call the instance's
        `reset` with the columns it accepts (and the episode's `seed` where it is an
        `Environment` or names a `seed` parameter: a plain class's `**kwargs` gets the row
        alone, as TRL passes it)."""
        self.begin_episode()
        begin_episode(self.instance, row.get("seed"))  # seeded and clean before its reset
        arguments = dict(accepted_kwargs(self.instance.reset)(row))
        if not is_environment_class(self.target) and not _names_seed(self.instance.reset):
            arguments.pop("seed", None)  # a class written for TRL: the row alone, as TRL gives
        with global_random_seeded(self.target, row.get("seed")):  # where the class asked
            return _resolved(self.instance.reset(**arguments))

    def begin_episode(self) -> None:
        """Forget the last episode's answer (`reset`, and `Stepper.begin_episode`)."""
        self.answered = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tools": None}  # a cache of schema classes: built again

    def tool_table(self) -> dict[str, Tool]:
        """The instance's tools (`instance_tools`: its class's, and tools it bound itself in
        `__init__` or `reset`), built again only when the class or those bindings change."""
        own, table = own_methods(self.instance), tool_table(self.target)
        cached = self._tools
        if cached is None or cached[0] is not table or cached[1] != own:
            cached = self._tools = (table, own, instance_tools(self.instance) if own else table)
        return cached[2]

    def snapshot(self) -> dict[str, Any]:
        """The instance's state (its hooks', or its attributes copied) and the answer."""
        return {"instance": state_of(self.instance), "answered": self.answered}

    def restore(self, state: dict[str, Any]) -> None:
        restore_into(self.instance, state["instance"])
        self.answered = state["answered"]

    def fork(self, n: int = 1) -> list[Executor]:
        copies: list[Executor] = []
        for clone in forked(self.instance, n):
            copy = LocalExecutor(clone)
            copy.answered = self.answered
            copies.append(copy)
        return copies

    def run(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        if self._over():
            return _episode_over(call)
        return self._noted(self._prepared(call, arguments).run())

    async def arun(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        if self._over():
            return _episode_over(call)
        return self._noted(await self._prepared(call, arguments).arun())

    def reward(self) -> float:
        """The reward as a number: a class that reports none (None) is an error here (a
        sandbox worker reports it so); `read_reward` is the reading that allows None."""
        value = self.read_reward()
        if value is None:
            raise TypeError(
                f"{self.target.__name__} reports no reward (None); this executor needs a number"
            )
        return value

    def read_reward(self) -> float | None:
        """`get_reward()`, else the `reward` attribute (0.0 without either); None (OpenEnv's
        default) is "no reward", as in TRL, and stays None."""
        get_reward = getattr(self.instance, "get_reward", None)
        value = get_reward() if callable(get_reward) else getattr(self.instance, "reward", 0.0)
        value = _resolved(value)
        return None if value is None else float(value)

    def done(self) -> bool:
        return bool(getattr(self.instance, "done", False))

    def final_answer(self, text: str) -> None:
        """The instance's `final_answer`; an exception it raises is the model's
        (`ModelCausedError`) unless it is typed already (an `EpisodeFailure`)."""
        if self._over():
            return  # graded already: an answer after the end changes nothing
        self.answered = True
        with _the_model_s("final_answer"):
            self._optional("final_answer", text)

    def user_turn(self, answer: str) -> str | None:
        """The instance's `user_turn` (None without one); an exception it raises is the
        model's (`ModelCausedError`) unless it is typed already (an `EpisodeFailure`)."""
        if self._over():
            return None
        with _the_model_s("user_turn"):
            return self._optional("user_turn", answer)

    def inline(self, text: str) -> InlineStep:
        """The instance's `inline_step`; an exception it raises is the model's
        (`ModelCausedError`) unless it is typed already (an `EpisodeFailure`). An answer that
        is no valid `InlineStep` is the environment's own fault (`as_inline_step` raises)."""
        if self._over():
            return InlineStep(f"{EPISODE_OVER}\n", done=True, failed=True)
        with _the_model_s("inline_step"):
            step = _resolved(self.instance.inline_step(text))
        return as_inline_step(step)

    def demonstration(self) -> Demonstration | None:
        return self._optional("demonstration")

    def metrics(self) -> dict[str, float]:
        return as_episode_metrics(self._optional("episode_metrics"))

    def close(self) -> None:
        self._optional("close")

    def _prepared(self, call: ToolCall, arguments: dict[str, Any]) -> PreparedCall:
        trl_text = not is_environment_class(self.target)  # a class written for TRL
        return PreparedCall(call, getattr(self.instance, call.name), arguments, trl_text)

    def _over(self) -> bool:
        return self.answered or self.done()

    def _noted(self, result: ToolResult) -> ToolResult:
        # the mark itself, not the tool table: a worker may lack what builds schemas
        name = getattr(result.call, "name", "")
        if result.ok and marked_ends_episode(getattr(self.instance, name, None)):
            self.answered = True
        return result

    def _optional(self, name: str, *args: Any) -> Any:
        method = getattr(self.instance, name, None)
        return _resolved(method(*args)) if callable(method) else None


@contextlib.contextmanager
def _the_model_s(hook: str) -> Iterator[None]:
    """Inside: the environment handles the model's text, so what it raises is the model's
    doing (`ModelCausedError`, with the original as its cause), except a failure already typed
    (`EpisodeFailure`: an `EnvironmentBug`, a simulated user's model that failed, ...)."""
    try:
        yield
    except EpisodeFailure:
        raise
    except Exception as error:
        what = _describe(error)
        what = what if len(what) <= 500 else f"{what[:500]}... [{len(what) - 500} more]"
        raise ModelCausedError(f"{hook} raised {what}") from error


def _resolved(value: Any) -> Any:
    """`value`, or what it resolves to if it is a coroutine (async protocol methods)."""
    return run_coroutine(value) if asyncio.iscoroutine(value) else value


def _episode_over(call: ToolCall | MalformedToolCall) -> ToolResult:
    return ToolResult(
        call, f"Error: {EPISODE_OVER}; no more tool calls are accepted.", "episode_over"
    )


def failure_status(error: BaseException) -> FailureKind:
    """The episode status of a failure during one of the model's calls: the one rule for whose
    a failure is, read from its type (`toolgym.envs.calls.EpisodeFailure`).

    A `ModelFailure` is the model's outcome, in the loss: `tool_timeout` for a timeout,
    `tool_crash` for the rest. Such are the environment's own code raising on the model's text
    (`ModelCausedError`, locally or from a sandbox worker) and a sandbox worker that was alive
    when the model's call began and died, broke the protocol or ran out of time while running
    it (the sandbox room's model-caused errors). Anything else is `env_error`, left out of the
    loss: an `EnvironmentBug` the environment raised, a worker that never started, a lost node
    (`InfrastructureFailure`), an exception of no failure type."""
    if isinstance(error, ModelFailure) and not isinstance(error, EnvironmentFailure):
        return "tool_timeout" if isinstance(error, TimeoutError) else "tool_crash"
    return "env_error"


class Stepper:
    """The stepping surface of one environment instance (see the module docstring).

    Attributes:
        executor: Where the instance lives.
        state: Where the episode stands (`EpisodeState`: turns, truncation, the answer, the
            failure that ended it, the reward read once); the Stepper writes it (and `turn`
            may be set, e.g. by a caller resuming a game).
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.state = EpisodeState()

    @property
    def turn(self) -> int:
        """Turns (assistant messages with tool calls) taken in this episode."""
        return self.state.turn

    @turn.setter
    def turn(self, value: int) -> None:
        self.state.turn = value

    @property
    def truncated(self) -> bool:
        """The episode reached `max_turns` without the environment ending it."""
        return self.state.truncated

    @property
    def answered(self) -> bool:
        """A tool marked `ends_episode` succeeded, or the final answer was given."""
        return self.state.answered

    @property
    def started(self) -> bool:
        """Whether an episode was started (stepping before `reset` is a programming error)."""
        return self.state.started

    @property
    def ended(self) -> tuple[FailureKind, str] | None:
        """The failure that ended the episode during a call, as (status, what happened): the
        executor failed (`failure_status`) or a call ran past its time limit (`astep`); later
        calls are refused."""
        return self.state.ended

    @property
    def unwrapped(self) -> Any:
        """The environment instance this Stepper steps (`env.unwrapped.answer`); None for a
        sandboxed one, which lives in another process."""
        return getattr(self.executor, "instance", None)

    # -- snapshots and forks -------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The live episode's whole state (`toolgym.envs.snapshots`): the environment's, the
        episode's and the executor's; `restore` goes back to it. `NotForkable` names what
        cannot be copied."""
        self._require_started("snapshot")
        return Snapshot(
            class_name(self.executor.target), self.executor.snapshot(), deepcopy(self.state)
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Go back to `snapshot`, taken of this environment or another of its class."""
        if snapshot.target != class_name(self.executor.target):
            raise ValueError(
                f"a snapshot of {snapshot.target} cannot restore {class_name(self.executor.target)}"
            )
        self.executor.restore(snapshot.environment)
        self.state = deepcopy(snapshot.episode)

    def fork(self, n: int = 1) -> list[Stepper]:
        """`n` independent live copies of this episode, each a `Stepper` of its own."""
        self._require_started("fork")
        if n < 1:
            raise ValueError("fork(n) needs n >= 1")
        copies = []
        for executor in self.executor.fork(n):
            copy = self._around(executor)
            copy.state = deepcopy(self.state)
            copies.append(copy)
        return copies

    def _around(self, executor: Executor) -> Stepper:
        """A Stepper of this kind over `executor` (a fork's)."""
        return Stepper(executor)

    def _require_started(self, what: str) -> None:
        if not self.state.started:
            raise RuntimeError(f"{self.executor.target.__name__}: call reset() before {what}()")

    # -- the episode ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None, **row: Any) -> str | None:
        """Start an episode from a dataset row's columns (only those the environment's `reset`
        accepts reach it); a returned string is shown first. At a class's first reset, a
        class that draws from the `random` module (which the seed cannot reach) is warned
        about (`toolgym.envs.seeding`)."""
        warn_if_unseedable(self.executor.target)
        observation = self.executor.reset({**row, "seed": seed})
        self.begin_episode()
        return None if observation is None else str(observation)

    def begin_episode(self) -> None:
        """Clear the turn count and the last episode's end (called by `reset`)."""
        self.state.begin()
        self.executor.begin_episode()

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas in the OpenAI function-calling format."""
        return [tool.schema for tool in self.table.values()]

    @property
    def table(self) -> dict[str, Tool]:
        """The environment's tools by name (the executor's `tool_table`: for an instance in
        this process, tools it bound in `__init__` included)."""
        return self.executor.tool_table()

    @property
    def max_turns(self) -> int | None:
        """The environment's own turn limit (None: none)."""
        return self.executor.max_turns

    @max_turns.setter
    def max_turns(self, value: int | None) -> None:
        self.executor.max_turns = value

    @property
    def reward_per_step(self) -> bool:
        """Whether the class asks for per-step rewards (`Environment.reward_per_step`; False
        for a plain class, as in TRL): with them, each `StepResult` carries the reward's
        change; without, the reward is read only when asked or at the step that ends the
        episode, so a lazy `reward` (computed on first access) is not frozen early."""
        return bool(getattr(self.executor.target, "reward_per_step", False))

    @property
    def reward(self) -> float | None:
        """The episode's reward (None: the environment reports none, OpenEnv's default)."""
        return self.get_reward()

    @property
    def done(self) -> bool:
        """Whether the environment ended the episode."""
        return self.executor.done()

    def get_reward(self) -> float | None:
        """The episode's reward: read from the environment now, or, for a class without
        per-step rewards whose episode is over, the value read once when it ended. None means
        "no reward" (as in TRL: no crash; a reward source with no value for an episode)."""
        state = self.state
        if state.final_reward is not None:
            return state.final_reward[0]
        value = self.executor.read_reward()
        if not self.reward_per_step and state.started and self._is_over() and not state.ended:
            state.final_reward = (value,)
        return value

    def final_answer(self, text: str) -> None:
        """Hand the model's last message (an answer without tool calls) to the environment,
        once: after it, or once the episode is over, nothing reaches the environment (graders
        grade once)."""
        if self._is_over():
            return
        self.state.answered = True
        self.executor.final_answer(text)

    def user_turn(self, answer: str) -> str | None:
        """The user's next message after the model's `answer` without tool calls (None: the
        user is done, and the answer goes to `final_answer`); None once the episode is over.
        A message that is not text is the environment's own fault (`EnvironmentBug`)."""
        if self._is_over():
            return None
        message = self.executor.user_turn(answer)
        if message is not None and not isinstance(message, str):
            raise EnvironmentBug(
                f"{self.executor.target.__name__}.user_turn returned "
                f"{type(message).__name__}, not a str or None"
            )
        return message

    def demonstration(self) -> Demonstration | None:
        """An expert's tool calls for this episode, one list per turn, if it has an expert."""
        return self.executor.demonstration()

    def episode_metrics(self) -> dict[str, float]:
        """The environment's named figures of this episode (`Environment.episode_metrics`)."""
        return self.executor.metrics()

    @property
    def inline_markers(self) -> tuple[str, ...]:
        """The inline protocol's markers (empty: the chat tool-call protocol)."""
        return tuple(getattr(self.executor.target, "inline_markers", ()) or ())

    def inline_step(self, text: str) -> InlineStep:
        """Hand the text the model wrote since the last marker to the environment; counts a
        turn (so the environment's `max_turns` applies) and returns its answer. Once the
        episode is over the text does not reach the environment: the answer says so (done)."""
        if self._begin_inline():
            return InlineStep(f"{EPISODE_OVER}\n", done=True, failed=True)
        return self._end_inline(self.executor.inline(text))

    async def ainline_step(self, text: str) -> InlineStep:
        """Like `inline_step`, without blocking the event loop."""
        if self._begin_inline():
            return InlineStep(f"{EPISODE_OVER}\n", done=True, failed=True)
        return self._end_inline(await asyncio.to_thread(self.executor.inline, text))

    def _begin_inline(self) -> bool:
        """Count a turn; True if the episode is over (nothing may run)."""
        if not self.state.started:
            raise RuntimeError(f"{self.executor.target.__name__}: call reset() before stepping")
        return self.state.open_turn(self.done)

    def _end_inline(self, step: InlineStep) -> InlineStep:
        done = self.done
        self.state.close_turn(self.max_turns, done)
        step.done = step.done or done
        return step

    def close(self) -> None:
        """Release the environment (its processes, files, container)."""
        self.executor.close()

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- stepping ------------------------------------------------------------------------------
    def step(self, tool_calls: AnyToolCall | Iterable[AnyToolCall]) -> StepResult:
        """Run one turn's tool calls in order and answer each with a tool message. Whatever the
        model sent, every call gets a message (an error it can read), never an exception.

        Once the episode is over (the environment is `done`, an `ends_episode` tool answered,
        the turn limit, or a failure ended it) no call reaches the environment: each gets an
        `episode_over` error and the reward cannot change. An executor that fails during a
        call (a sandbox worker that died or timed out) is not an exception either: that call's
        result names the failure, the episode ends (`terminated`), and `info["ended"]` holds
        its status (`failure_status`) and `info["error"]` what happened."""
        calls, reward_before, began_over = self._begin_step(tool_calls)
        results = []
        for call in calls:
            checked = self._check(call)
            if isinstance(checked, ToolResult):
                results.append(checked)
                continue
            try:
                result = self.executor.run(*checked)
            except Exception as error:
                result = self._failed(checked[0], failure_status(error), _describe(error))
            results.append(self._note_answer(result))
        return self._end_step(results, reward_before, began_over)

    async def astep(
        self,
        tool_calls: AnyToolCall | Iterable[AnyToolCall],
        *,
        call_timeout: float | None = None,
        turn_timeout: float | None = None,
    ) -> StepResult:
        """Like `step`, without blocking the event loop; with time limits for each call
        (`call_timeout` seconds) and for the turn's calls together (`turn_timeout`). A call
        past either limit is the model's doing (its code slept or spun, or it made calls
        that add up): it is stopped (a sandbox worker is killed; a sync tool's thread is left
        to finish), its result says why, and the episode ends with `info["ended"]` =
        `tool_timeout`."""
        calls, reward_before, began_over = self._begin_step(tool_calls)
        clock = TimeLimits(call_timeout, turn_timeout).turn_clock()
        results = []
        for call in calls:
            checked = self._check(call)
            if isinstance(checked, ToolResult):
                results.append(checked)
                continue
            name = checked[0].name
            limit, why = clock.next_call()
            if limit is not None and limit <= 0:  # the turn's time is spent: do not start it
                results.append(self._failed(checked[0], "tool_timeout", f"{name} {why}"))
                continue
            try:
                result = await within(self.executor.arun(*checked), limit, name)
            except CallTimedOut:
                result = self._failed(checked[0], "tool_timeout", f"{name} {why}")
            except Exception as error:
                result = self._failed(checked[0], failure_status(error), _describe(error))
            results.append(self._note_answer(result))
        return self._end_step(results, reward_before, began_over)

    def _failed(self, call: ToolCall, status: FailureKind, what: str) -> ToolResult:
        """A call the executor could not finish: the episode ends with `status`."""
        self.state.fail(status, what)
        return ToolResult(call, f"Error: {what}. The episode is over.", status)

    def _note_answer(self, result: ToolResult) -> ToolResult:
        tool = self.table.get(getattr(result.call, "name", ""))
        if result.ok and tool is not None and tool.ends_episode:
            self.state.answered = True
        return result

    def _is_over(self) -> bool:
        return self.state.over(self.done)

    def _begin_step(
        self, tool_calls: AnyToolCall | Iterable[AnyToolCall]
    ) -> tuple[list[ToolCall | MalformedToolCall], float | None, bool]:
        """The calls, the reward before them (a number with per-step rewards: the step
        reports the change; else None, nothing is read here), and whether the step began
        after the episode was over (counting a turn otherwise)."""
        if not self.state.started:
            raise RuntimeError(f"{self.executor.target.__name__}: call reset() before step()")
        calls = as_call_list(tool_calls)
        began_over = self.state.open_turn(self.done)
        return calls, (_number(self.get_reward()) if self.reward_per_step else None), began_over

    def _step_reward(self, before: float | None, began_over: bool) -> float:
        """A step's reward: the change (per-step rewards), else the episode's reward at the
        step that ends it (read once) and 0 before it; 0 for a step after the end, or when a
        failure ended it (the environment may be gone: the agent reads what it can)."""
        if before is not None:
            return _number(self.get_reward()) - before
        if began_over or self.state.ended is not None or not self._is_over():
            return 0.0
        return _number(self.get_reward())

    def _end_step(
        self, results: list[ToolResult], reward_before: float | None, began_over: bool
    ) -> StepResult:
        state, done = self.state, self.done
        state.close_turn(self.max_turns, done)
        return StepResult(
            messages=[r.message for r in results],
            reward=self._step_reward(reward_before, began_over),
            terminated=done or state.answered or state.ended is not None,
            truncated=state.truncated,
            info=_step_info(results, state.turn, state.answered, state.ended),
            results=results,
        )

    def _check(
        self, call: ToolCall | MalformedToolCall
    ) -> ToolResult | tuple[ToolCall, dict[str, Any]]:
        """An error result if the call cannot run, else the call and its checked arguments."""
        if isinstance(call, MalformedToolCall):
            return ToolResult(
                call, f"Error: could not parse the tool call: {call.reason}", "malformed"
            )
        if self._is_over():
            return ToolResult(call, self.state.refusal(self.done), "episode_over")
        return checked_call(call, self.table)


def _step_info(
    results: list[ToolResult], turn: int, answered: bool, ended: tuple[str, str] | None
) -> dict[str, Any]:
    """A `StepResult`'s `info`: the turn, the calls and their failures, and how it ended."""
    failures = [r for r in results if not r.ok]
    return {
        "turn": turn,
        "tool_calls": len(results),
        "tool_failures": len(failures),
        "failures": [{"kind": r.failure, "message": r.content} for r in failures],
        "answered": answered,
        "ended": None if ended is None else ended[0],
        "error": None if ended is None else ended[1],
    }


def checked_call(
    call: ToolCall, table: dict[str, Tool]
) -> ToolResult | tuple[ToolCall, dict[str, Any]]:
    """The call and its arguments checked against the tool table, or the error result the
    model reads (an unknown tool names the available ones; bad arguments, the signature)."""
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
    return call, arguments


def _number(reward: float | None) -> float:
    """A reward in a sum: None ("no reward") counts as 0."""
    return 0.0 if reward is None else reward


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def as_environment(obj: Any, reset: Callable[..., Any] | None = None) -> Stepper:
    """What the agent and trainers step: a `Stepper` as it is; a list of plain tool functions
    as a stateless environment (`toolgym.envs.functions`); an `Environment` or any other object
    with `reset` and public methods, in a `Stepper`. The tool table is built here, from the
    instance (tools it bound in `__init__` included), so a method that cannot be a tool, or
    that clashes with a protocol hook, fails now, naming it.

    `reset`: for an instance whose class has no `reset` (BFCL's tool classes load a scenario
    with `_load_scenario(initial_config)`), a function `reset(instance, **columns)` that starts
    its episodes, bound to the instance as its `reset` (the row's columns it names reach it, as
    for a method). In this process only: a sandbox builds the instance from its class, so there
    the class needs a `reset` of its own (a subclass in a module)."""
    if isinstance(obj, Stepper):
        if reset is not None:
            raise TypeError("reset= is for an instance, not an environment already stepped")
        return obj
    if is_function_list(obj):  # plain tool functions, as TRL's `tools=[...]`
        obj = function_tools(obj)
    if reset is not None:
        _bind_reset(obj, reset)
    stepper = Stepper(LocalExecutor(obj))
    stepper.table  # noqa: B018 (built now, from the instance: a bad method fails here)
    return stepper


def _bind_reset(instance: Any, reset: Callable[..., Any]) -> None:
    """Set `reset` on `instance` as its bound `reset` method; refuse an instance that has one."""
    if not callable(reset):
        raise TypeError(f"reset= must be a function reset(instance, **columns), not {reset!r:.60}")
    if callable(getattr(instance, "reset", None)):
        raise TypeError(
            f"{type(instance).__name__} has a reset() of its own; reset= is for a class "
            "without one (toolgym does not guess which of the two should start episodes)"
        )
    instance.reset = types.MethodType(reset, instance)


def trl_shaped(env: Any) -> bool:
    """Whether `env` steps a class written for TRL's `environment_factory` (a plain class, or
    plain tool functions): the model then reads what TRL shows it (TRL's schemas, tool results
    as `str(value)`, reset's observation appended to the prompt as TRL appends it;
    docs/trl.md). False for `toolgym.Environment` subclasses, executor-backed environments
    (MCP, OpenEnv) and anything that is not a `Stepper`."""
    executor = getattr(env, "executor", None)
    target = getattr(executor, "target", None)
    if not isinstance(target, type) or target is type(executor):
        return False
    return not is_environment_class(target)


def _names_seed(reset: Callable[..., Any]) -> bool:
    """Whether `reset` has a parameter named `seed` (not just `**kwargs`)."""
    try:
        return "seed" in inspect.signature(reset).parameters
    except (TypeError, ValueError):
        return False
