"""How long the model's calls into an environment may take, decided and enforced here only.

Every wait on an environment that an episode makes runs through `within`: one tool call (under
its own limit and what is left of its turn's, `TurnClock`), the hooks the model's text reaches
(`final_answer`, `user_turn`, `inline_step`: one call each), reading the outcome (`get_reward`,
`episode_metrics`), and an agent program's whole run. `TimeLimits` holds the seconds, built
once per episode from `AgentLimits`; past a limit, `within` raises `CallTimedOut`, a
`ModelFailure` (the model's code or calls decided how long the tools ran: `tool_timeout`), or
`ReadTimedOut`, an `EnvironmentFailure` for waits that are not the model's (reading the reward).
A sandbox's own limit on a request, which kills its worker, is the sandbox's (`RemoteExecutor`)
and arrives here as the typed failure it raised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from toolgym.envs.calls import EnvironmentFailure, EpisodeFailure, ModelFailure

T = TypeVar("T")


class CallTimedOut(ModelFailure, TimeoutError):
    """A call the model caused ran past its time limit: `tool_timeout`, in the loss."""


class ReadTimedOut(EnvironmentFailure, TimeoutError):
    """Reading the episode's outcome ran past its limit: `env_error`, out of the loss."""


@dataclass(frozen=True)
class TimeLimits:
    """Seconds the model's calls may take (None: no limit).

    Attributes:
        call: One tool call, or one hook the model's text reaches.
        turn: One turn's tool calls together; also the limit of reading the outcome.
    """

    call: float | None = None
    turn: float | None = None

    @property
    def one_call(self) -> float | None:
        """The limit of a call that is a turn of its own (a hook): the smaller of the two."""
        limits = [s for s in (self.call, self.turn) if s is not None]
        return min(limits) if limits else None

    @property
    def backstop(self) -> float | None:
        """A turn's limit plus some grace: the wait on a whole turn, which stops only an
        event loop held past what the stepping layer enforces call by call."""
        return None if self.turn is None else self.turn + min(self.turn, 5.0)

    def turn_clock(self) -> TurnClock:
        """A clock for one turn's calls, started now."""
        return TurnClock(self)


class TurnClock:
    """What is left of one turn's time: the limit of each next call, and why."""

    def __init__(self, limits: TimeLimits) -> None:
        self.limits = limits
        self.deadline = None if limits.turn is None else time.monotonic() + limits.turn

    def next_call(self) -> tuple[float | None, str]:
        """The seconds the next call may take (<= 0: the turn's time is spent), and what
        passing them means, for its message."""
        call, turn = self.limits.call, self.limits.turn
        left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        if left is not None and (call is None or left < call):
            return left, f"ran past the turn's time limit: the turn's calls took over {turn:g} s"
        if call is None:
            return None, ""
        return call, f"took over {call:g} s, the time limit of one tool call"


async def within(
    work: Awaitable[T], seconds: float | None, what: str, *, model_caused: bool = True
) -> T:
    """`work`, stopped after `seconds`: past them `CallTimedOut` ("`what` took over N s"), or
    `ReadTimedOut` where the wait is not the model's (`model_caused=False`). A timeout the work
    raises itself (a sandbox's, already typed) passes through unchanged."""
    scope = asyncio.timeout(seconds)
    try:
        async with scope:
            return await work
    except TimeoutError as error:
        if not scope.expired() or isinstance(error, EpisodeFailure):  # typed where it arose
            raise
        failure = CallTimedOut if model_caused else ReadTimedOut
        raise failure(f"{what} took over {seconds:g} s") from error
