"""Where one episode stands: the single record of its turns, its end and its final reward.

A `Stepper` owns one `EpisodeState` per environment and consults it before and after every
turn; nothing else decides whether the episode is over. The episode ends in one of four ways:
the environment says so (`done`, read live from the environment, not kept here), a tool
marked `ends_episode` succeeded or the model gave its final answer (`answered`), the turn
limit passed (`truncated`), or a call failed in a way that ends it (`ended`: the failure's
status and what happened). For environments without per-step rewards, the reward is read
once the episode is over and kept (`final_reward`), so a grader runs once and a lazy reward
is not frozen early.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolgym.envs.calls import EPISODE_OVER, FailureKind

TURN_LIMIT = "the turn limit was reached"


@dataclass
class EpisodeState:
    """One episode's progress and end (see the module docstring).

    Attributes:
        started: An episode was started (`begin`); stepping before it is a programming error.
        turn: Turns taken (assistant messages with tool calls, or inline segments).
        truncated: The turn limit passed before the episode ended otherwise.
        answered: A tool marked `ends_episode` succeeded, or the model gave its final answer.
        ended: The failure that ended the episode during a call, as (status, what happened).
        final_reward: The reward read once the episode was over, in a 1-tuple (its value may
            be None: "no reward"); None until then.
    """

    started: bool = False
    turn: int = 0
    truncated: bool = False
    answered: bool = False
    ended: tuple[FailureKind, str] | None = None
    final_reward: tuple[float | None] | None = None

    def begin(self) -> None:
        """A new episode: no turn taken, no end, no reward read."""
        self.started, self.turn, self.truncated, self.answered = True, 0, False, False
        self.ended, self.final_reward = None, None

    def over(self, done: bool) -> bool:
        """Whether the episode is over (`done`: the environment's own word)."""
        return self.ended is not None or done or self.truncated or self.answered

    def open_turn(self, done: bool) -> bool:
        """Count a turn, unless the episode is already over; returns whether it was over."""
        if self.over(done):
            return True
        self.turn += 1
        return False

    def close_turn(self, max_turns: int | None, done: bool) -> None:
        """After a turn: past `max_turns`, an episode that did not end otherwise is
        truncated."""
        if max_turns is not None and self.turn >= max_turns and not done:
            self.truncated = not self.answered

    def fail(self, status: FailureKind, what: str) -> None:
        """A call failed in a way that ends the episode (later calls are refused)."""
        self.ended = (status, what)

    def refusal(self, done: bool) -> str:
        """Why a call after the end is refused, as the model reads it."""
        if self.truncated and not (done or self.answered or self.ended):
            return f"Error: {TURN_LIMIT}; no more tool calls are accepted."
        return f"Error: {EPISODE_OVER}; no more tool calls are accepted."
