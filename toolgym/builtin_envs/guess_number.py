"""GuessNumber: find a hidden whole number from "higher" / "lower" answers."""

from __future__ import annotations

import math
import random
from typing import Any

from toolgym.envs.calls import ToolError
from toolgym.envs.core import Environment

PROMPT = (
    "I am thinking of a whole number between {low} and {high}. Find it with the `guess` tool; "
    "after each guess I answer higher, lower or correct. Fewer guesses earn more reward."
)


class GuessNumber(Environment):
    """Guess a number in `[low, high]` with a `guess(n)` tool.

    Reward on success is `min(1, optimal / guesses)`, where `optimal` is the worst case of
    binary search, `ceil(log2(high - low + 1))`: playing binary search always earns 1, and
    every extra guess costs. No reward if the turn limit is reached first.

    Args:
        low: Smallest possible number.
        high: Largest possible number.
        max_turns: Turns with tool calls before truncation.
    """

    def __init__(self, low: int = 1, high: int = 100, max_turns: int = 10) -> None:
        if high <= low:
            raise ValueError(f"need low < high, got [{low}, {high}]")
        self.low, self.high = low, high
        self.max_turns = max_turns
        self.target = low
        self.guesses = 0

    @property
    def optimal_guesses(self) -> int:
        """Guesses a binary search needs for this target."""
        return max(1, math.ceil(math.log2(self.high - self.low + 1)))

    def reset(self, target: int | None = None) -> str | None:
        if target is None:
            target = self.rng.randint(self.low, self.high)
        if not self.low <= target <= self.high:
            raise ValueError(f"target {target} is outside [{self.low}, {self.high}]")
        self.target = target
        self.guesses = 0
        return None

    def guess(self, n: int) -> str:
        """Guess the hidden number.

        Args:
            n: A whole number in the announced range.
        """
        if not self.low <= n <= self.high:
            shown = str(n) if abs(n) < 10**18 else "That number"  # str() refuses 4,300 digits
            raise ToolError(f"{shown} is outside the range {self.low} to {self.high}.")
        self.guesses += 1
        if n < self.target:
            return f"{n} is too low: the number is higher."
        if n > self.target:
            return f"{n} is too high: the number is lower."
        self.done = True
        self.reward = min(1.0, self.optimal_guesses / self.guesses)
        return f"Correct! The number is {n}; you needed {self.guesses} guesses."


def guess_number_dataset(
    n: int, seed: int = 0, low: int = 1, high: int = 100
) -> list[dict[str, Any]]:
    """`n` prompts with hidden targets; columns `prompt` and `target`."""
    rng = random.Random(seed)
    prompt = [{"role": "user", "content": PROMPT.format(low=low, high=high)}]
    return [{"prompt": prompt, "target": rng.randint(low, high)} for _ in range(n)]
