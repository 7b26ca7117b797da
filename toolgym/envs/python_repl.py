"""`PythonREPL-v0`: a stateful Python session the model drives with one tool, `run(code)`.

Model-written code runs here, so the registered environment defaults to the strongest sandbox
available (`toolgym.sandbox.strongest_backend()`: docker, else process). Standard library
only, so it runs inside the minimal worker image.
"""

from __future__ import annotations

import ast
import contextlib
import io
import traceback
from typing import Any

from toolgym.envs.core import Environment

OUTPUT_LIMIT = 4000
"""Characters of stdout, of stderr and of the last expression's repr that are returned; the
rest is cut and replaced by a note saying how much was dropped."""


class PythonREPL(Environment):
    """A persistent Python namespace; each `run` sees what earlier calls defined.

    Args:
        max_turns: Turns before the episode is truncated.
        output_limit: Characters kept per stream (see `OUTPUT_LIMIT`).
    """

    runs_model_code = True
    """Code the model writes runs in this object's process: a sandbox pool gives each episode
    a fresh worker (`SandboxPool(max_uses=None)`), so what one episode's code changed in the
    worker cannot reach the next."""

    def __init__(self, max_turns: int = 16, output_limit: int = OUTPUT_LIMIT) -> None:
        self.max_turns = max_turns
        self.output_limit = output_limit
        self.namespace: dict[str, Any] = {}
        self.task: str | None = None
        self.answer: str | None = None

    def reset(self, task: str | None = None, answer: str | None = None) -> str | None:
        """Start with a fresh namespace; `task` is shown to the model, `answer` grades it."""
        self.namespace = {"__name__": "__repl__"}
        self.task, self.answer = task, answer
        return task

    def run(self, code: str) -> str:
        """Run Python code in the session and return its output.

        Args:
            code: Python statements; the value of a final expression is shown like in a REPL.
        """
        stdout, stderr = io.StringIO(), io.StringIO()
        value = None
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                value = self._execute(code)
            except (Exception, SystemExit) as error:  # failing code is output, not a crash
                stderr.write(_traceback(error))
        parts = [f"stdout:\n{self._cut(stdout.getvalue())}"]
        if stderr.getvalue():
            parts.append(f"stderr:\n{self._cut(stderr.getvalue())}")
        if value is not None:
            parts.append(f"value: {self._cut(repr(value))}")
        return "\n".join(parts)

    def final_answer(self, text: str) -> None:
        if self.answer is not None:
            self.reward = float(text.strip() == self.answer.strip())
            self.done = True

    def _execute(self, code: str) -> Any:
        tree = ast.parse(code, mode="exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
            exec(compile(tree, "<repl>", "exec"), self.namespace)
            return eval(compile(ast.Expression(last.value), "<repl>", "eval"), self.namespace)
        exec(compile(tree, "<repl>", "exec"), self.namespace)
        return None

    def _cut(self, text: str) -> str:
        if len(text) <= self.output_limit:
            return text
        dropped = len(text) - self.output_limit
        return f"{text[: self.output_limit]}\n... [{dropped} more characters cut]"


def _traceback(error: BaseException) -> str:
    """The traceback of the model's code only (frames of `<repl>`), like the REPL prints."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == "<repl>"]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames) + traceback.format_exception_only(error)
    return "".join(lines)


def python_repl_dataset(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Small computation tasks with exact answers (sum of squares up to k)."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(10, 10_000)
        task = f"Compute the sum of the squares of the integers 1..{k}. Answer with the number."
        rows.append(
            {
                "prompt": [{"role": "user", "content": task}],
                "answer": str(k * (k + 1) * (2 * k + 1) // 6),
            }
        )
    return rows
