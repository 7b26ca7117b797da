"""Arithmetic with calculator tools: "Multiply 4821 and 9384", graded on the final answer."""

from __future__ import annotations

import random
import re
from typing import Any, Literal

from toolgym.envs.calls import ToolError
from toolgym.envs.core import Environment

Operation = Literal["add", "subtract", "multiply", "divide"]
OPERATIONS: tuple[Operation, ...] = ("add", "subtract", "multiply", "divide")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

INSTRUCTIONS = "Use the calculator tools, then reply with the final result as a plain number."


def question(a: int, b: int, operation: Operation) -> str:
    """The task in words, e.g. `Multiply 4821 and 9384.`"""
    return {
        "add": f"Add {a} and {b}.",
        "subtract": f"Subtract {b} from {a}.",
        "multiply": f"Multiply {a} and {b}.",
        "divide": f"Divide {a} by {b}.",
    }[operation]


def solve(a: int, b: int, operation: Operation) -> int:
    """The exact answer (division problems are built to divide evenly)."""
    if operation == "divide":
        if b == 0 or a % b:
            raise ValueError(f"{a} / {b} is not a whole number")
        return a // b
    return {"add": a + b, "subtract": a - b, "multiply": a * b}[operation]


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


class Arithmetic(Environment):
    """A calculator environment: `add`, `subtract`, `multiply` and `divide` tools.

    The episode is graded on the model's final message (the one without a tool call): reward
    1 if the last number in it equals the exact answer, else 0.

    Args:
        digits: Digits of the random operands when `reset` is not given them.
        operations: The operations random problems are drawn from.
        max_turns: Turns with tool calls before truncation.
    """

    def __init__(
        self,
        digits: int = 4,
        operations: tuple[Operation, ...] = OPERATIONS,
        max_turns: int = 6,
    ) -> None:
        self.digits = digits
        self.operations = tuple(operations)
        self.max_turns = max_turns
        self.target = 0
        self.submitted: str | None = None

    def reset(
        self, a: int | None = None, b: int | None = None, operation: Operation | None = None
    ) -> str | None:
        if a is None or b is None or operation is None:
            a, b, operation = random_problem(self.rng, self.digits, self.operations)
        self.target = solve(a, b, operation)
        self.submitted = None
        return None

    def final_answer(self, text: str) -> None:
        numbers = _NUMBER.findall(text)
        self.submitted = numbers[-1].replace(",", "") if numbers else None
        correct = self.submitted is not None and float(self.submitted) == self.target
        self.reward = 1.0 if correct else 0.0
        self.done = True

    def add(self, a: float, b: float) -> int | float:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return _number(a + b)

    def subtract(self, a: float, b: float) -> int | float:
        """Subtract b from a.

        Args:
            a: The number to subtract from.
            b: The number to subtract.
        """
        return _number(a - b)

    def multiply(self, a: float, b: float) -> int | float:
        """Multiply two numbers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return _number(a * b)

    def divide(self, a: float, b: float) -> int | float:
        """Divide a by b.

        Args:
            a: The dividend.
            b: The divisor (not zero).
        """
        if b == 0:
            raise ToolError("division by zero")
        return _number(a / b)


def random_problem(
    rng: random.Random, digits: int, operations: tuple[Operation, ...] = OPERATIONS
) -> tuple[int, int, Operation]:
    """Two `digits`-digit operands and an operation (division exact)."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    operation = rng.choice(operations)
    a, b = rng.randint(low, high), rng.randint(low, high)
    if operation == "divide":
        a = a * b  # so that the quotient is exact
    return a, b, operation


def arithmetic_dataset(n: int, seed: int = 0, digits: int = 4) -> list[dict[str, Any]]:
    """`n` calculator problems; columns `prompt`, `a`, `b`, `operation`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, operation = random_problem(rng, digits)
        content = f"{question(a, b, operation)} {INSTRUCTIONS}"
        rows.append(
            {
                "prompt": [{"role": "user", "content": content}],
                "a": a,
                "b": b,
                "operation": operation,
            }
        )
    return rows
