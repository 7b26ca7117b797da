"""Environments for tests/test_envs/test_grade_once.py and tests/test_agents/test_model_failures.py
(imported by sandbox workers too, so they live in a module of their own)."""

from __future__ import annotations

import time

import toolgym


class Quiz(toolgym.Environment):
    """One question; `submit` is the answer (`ends_episode`) and grades it."""

    def reset(self, answer: str = "42") -> str | None:
        self.answer, self.graded = answer, 0
        return "What is six times seven?"

    @toolgym.ends_episode
    def submit(self, answer: str) -> str:
        """Answer the question.

        Args:
            answer: The answer.
        """
        self.graded += 1
        self.reward = float(answer.strip() == self.answer)
        return f"graded ({self.graded})"

    def note(self, text: str) -> str:
        """Write a note.

        Args:
            text: Anything.
        """
        return text


class Sleeper(toolgym.Environment):
    """A tool that sleeps: the model chooses for how long (as model-written code would)."""

    def reset(self) -> str | None:
        return "Sleep."

    def sleep(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "slept"


class InWorker(toolgym.Environment):
    """Runs the model's code in the environment's own process (no session): inside a sandbox
    only the sandbox stands between the code and the worker, which the code can end."""

    runs_model_code = True

    def reset(self) -> str | None:
        return "Run code."

    def run(self, code: str) -> str:
        """Run Python code; the value of `result` is shown.

        Args:
            code: Python statements.
        """
        namespace: dict = {}
        exec(code, namespace)
        return str(namespace.get("result"))
