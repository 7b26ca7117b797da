"""`Environment`: the base class of an environment's state and tools.

An environment is one episode's worth of state. `reset(**row)` starts an episode from a
dataset row; every public method is a tool the model may call. Stepping (argument checks,
turns, error messages) is not the class's job: `step` / `astep` / `tools` go through the
instance's own `Stepper` (`toolgym.envs.stepping`), the class that also steps plain classes
(over a `LocalExecutor`) and sandboxed instances (over a `RemoteExecutor`).
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from toolgym.envs.calls import (
    AnyToolCall,
    Demonstration,
    StepResult,
    accepted_kwargs,
    run_coroutine,
)
from toolgym.envs.inline import InlineStep
from toolgym.envs.seeding import global_random_seeded, warn_if_unseedable
from toolgym.envs.stepping import LocalExecutor, Steppable, Stepper


class Environment:
    """Base class for toolgym environments; one instance per rollout.

    Subclass it, implement `reset(**row)` and write tools as public methods with type hints and
    a Google-style docstring. Set `self.reward` and `self.done` from the tools; read `self.rng`
    for randomness so that two instances reset with the same seed behave the same.

    The one thing the base class does when a subclass is defined: it wraps the subclass's
    `reset`, so that `env.reset(seed=0, **row)` seeds `rng`, clears `reward`, `done` and the
    turn count, and passes on only the columns the override accepts (no `super().reset()`).

    Attributes:
        reward: The episode's reward so far (set it from the tools).
        done: True once the episode is over (the environment says so).
        max_turns: Assistant turns before the episode is truncated (None: no limit of its own).
            The agent's `AgentLimits.max_turns` counts the same turns.
        rng: A `random.Random` seeded by `reset(seed=...)`.
    """

    reward: float = 0.0
    done: bool = False
    max_turns: int | None = None
    seed_global_random: ClassVar[bool] = False
    """Set True if the class draws from the `random` module (not `self.rng`) and cannot be
    changed: toolgym then seeds the module with the episode's seed before each reset (such
    resets take turns); without it, the first reset warns (`toolgym.envs.seeding`)."""
    reward_per_step: ClassVar[bool] = True
    """Whether `step` reports the change of `reward` over each step (the reward is read before
    and after every step). An `Environment`'s tools set a plain `reward` attribute, so reading
    it often is free; a subclass whose `reward` is computed when read (a verifier run once, on
    first access) sets this False: the reward is then read once, when the episode ends, as for
    a plain class (TRL's contract)."""
    _stepper: Stepper  # made in __new__
    _episode_seed: int | None
    _resetting: int
    inline_markers: ClassVar[tuple[str, ...]] = ()
    """Markers of the inline protocol (`toolgym.envs.inline`): when not empty, the model writes
    in one assistant turn, generation stops after each marker and `inline_step` answers the
    text written since the last one; the chat tool-call protocol is not used."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Environment:
        # The instance's Stepper exists from the start (also when a subclass's __init__ does
        # not call super().__init__, and without a race between threads).
        instance = super().__new__(cls)
        instance._stepper = Stepper(LocalExecutor(instance))
        return instance

    def __init__(self) -> None:
        """No constructor arguments of its own: a subclass that takes some defines `__init__`
        (an unknown argument is a TypeError, not silently dropped)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "reset" in cls.__dict__:
            cls.reset = _with_episode_start(cls.__dict__["reset"])  # type: ignore[method-assign]

    # -- the episode ---------------------------------------------------------------------------
    def reset(self, *args: Any, **kwargs: Any) -> str | None:
        """Start an episode from a dataset row's columns (and `seed`); a returned string is
        shown first.

        Subclasses override this with the columns they need (extra columns are not passed
        to them) and do not need to call `super().reset()`; one that does keeps the episode's
        seed (a `super().reset(...)` inside a reset does not start the episode again).
        """
        seed = kwargs.get("seed", args[0] if args else None)
        if not self._episode_starting:
            self._start_episode(seed)
        elif seed is not None:
            self._rng = random.Random(seed)
        return None

    def close(self) -> None:
        """Release what the environment holds (processes, files); called once at the end."""

    def get_reward(self) -> float | None:
        """The episode's reward so far (None: no reward)."""
        return None if self.reward is None else float(self.reward)

    def final_answer(self, text: str) -> None:
        """Called with the model's last message when it answers without calling a tool.

        Environments that grade a final answer (rather than a tool call) override this and
        set `reward` / `done`. The default ignores the text.
        """

    def inline_step(self, text: str) -> InlineStep | str | None:
        """The inline protocol's step: `text` is what the model wrote since the last marker,
        the marker included. Return an observation to append inline (a string), an
        `InlineStep` (observation, per-step reward, done), or None. Set `reward` / `done` as
        from a tool. Needed when `inline_markers` is set."""
        raise NotImplementedError(
            f"{type(self).__name__} sets inline_markers but does not implement inline_step"
        )

    async def ainline_step(self, text: str) -> InlineStep:
        """Like `inline_step`, without blocking the event loop (it runs in a worker thread)."""
        return await self.stepper.ainline_step(text)

    def episode_metrics(self) -> dict[str, float]:
        """Named figures of the episode besides its reward, read once when it ends: the skills
        behind the reward (Wordle: `valid_guesses`, `consistent_guesses`, `win`, ...), so a
        run can say which one moved. Trainers log each one's mean per step as `env/<name>`,
        evaluations summarise them, and the run viewer plots them. The default has none."""
        return {}

    def demonstration(self) -> Demonstration | None:
        """An expert's tool calls for the current episode, one list per turn (for SFT warm-up);
        for inline environments, the pieces of text the expert writes, each ending with a
        marker.

        Called right after `reset`; it must not change the episode's state. The default has
        no expert and returns None.
        """
        return None

    @property
    def rng(self) -> random.Random:
        """This episode's random generator, seeded by `reset(seed=...)`."""
        if "_rng" not in self.__dict__:
            self._rng = random.Random()
        return self._rng

    # -- stepping, through the instance's own Stepper -------------------------------------------
    @property
    def stepper(self) -> Stepper:
        """The `Stepper` that steps this instance in this process."""
        return self._stepper

    def __getstate__(self) -> dict[str, Any]:
        # A copy or a pickle gets a Stepper of its own (one pointing at the original would
        # step the original), with the same turn count.
        state = self.__dict__.copy()
        stepper = state.pop("_stepper")
        state["_stepper_counts"] = (stepper.turn, stepper.truncated, stepper.started)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        counts = state.pop("_stepper_counts", None)
        self.__dict__.update(state)
        if counts is not None:
            self._stepper.turn, self._stepper.truncated, self._stepper.started = counts

    def step(self, tool_calls: AnyToolCall | Iterable[AnyToolCall]) -> StepResult:
        """Run one turn's tool calls in order and answer each with a tool message."""
        return self.stepper.step(tool_calls)

    async def astep(self, tool_calls: AnyToolCall | Iterable[AnyToolCall]) -> StepResult:
        """Like `step`, without blocking the event loop: sync tools run in a worker thread."""
        return await self.stepper.astep(tool_calls)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas in the OpenAI function-calling format."""
        return self.stepper.tools

    @property
    def turn(self) -> int:
        """Turns taken in this episode."""
        return self.stepper.turn

    @turn.setter
    def turn(self, value: int) -> None:
        self.stepper.turn = value

    @property
    def truncated(self) -> bool:
        """Whether the episode reached `max_turns` without the environment ending it."""
        return self.stepper.truncated

    @truncated.setter
    def truncated(self, value: bool) -> None:
        self.stepper.truncated = value

    @property
    def _episode_starting(self) -> bool:
        """Whether a `reset` of this instance is running (a `super().reset()` inside it
        belongs to the same episode start)."""
        return self.__dict__.get("_resetting", 0) > 0

    def _start_episode(self, seed: int | None) -> None:
        self._rng = random.Random(seed)
        self.reward = 0.0
        self.done = False
        self.stepper.begin_episode()


def _with_episode_start(reset: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a subclass's `reset` so that every episode starts seeded and clean."""
    pass_kwargs = accepted_kwargs(reset)

    @functools.wraps(reset)
    def reset_episode(self: Environment, seed: int | None = None, **row: Any) -> str | None:
        if self._episode_starting:
            # `super().reset(...)` from a subclass's reset: the same episode, already started
            # and seeded; a seed passed explicitly reseeds `rng`, None keeps the episode's.
            if seed is not None:
                self._rng = random.Random(seed)
            else:
                seed = self.__dict__.get("_episode_seed")
            return _resolved(reset(self, **pass_kwargs({**row, "seed": seed})))
        warn_if_unseedable(type(self))
        self._start_episode(seed)
        self._episode_seed = seed
        self._resetting = 1
        try:
            with global_random_seeded(type(self), seed):  # where the class asked
                return _resolved(reset(self, **pass_kwargs({**row, "seed": seed})))
        finally:
            self._resetting = 0

    # What callers see (functools.wraps would show the override's): the seed and any column.
    reset_episode.__signature__ = _RESET_SIGNATURE  # type: ignore[attr-defined]
    return reset_episode


if TYPE_CHECKING:  # an Environment is Steppable (checked by mypy, not at run time)
    _ENVIRONMENT_IS_STEPPABLE: type[Steppable] = Environment


def _resolved(value: Any) -> Any:
    return run_coroutine(value) if inspect.iscoroutine(value) else value


def _reset_signature(self: Environment, seed: int | None = None, **row: Any) -> str | None: ...


_RESET_SIGNATURE = inspect.signature(_reset_signature)
