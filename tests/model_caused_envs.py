"""Environments for tests/test_envs/test_model_caused_errors.py whose own code fails on the model's
text (imported by sandbox workers too, so they live in a module of their own)."""

from __future__ import annotations

from typing import ClassVar

import toolgym


class Fragile(toolgym.Environment):
    """A grader that indexes into the model's text: an empty answer raises IndexError, as
    PythonLines did on `print(file=sys.stderr)`. `bug` in the text raises `EnvironmentBug`
    instead (the environment's own failure)."""

    inline_markers: ClassVar[tuple[str, ...]] = ("\n",)

    def reset(self) -> str | None:
        self.reward = 0.5  # what the environment reported before the crash
        return None

    def inline_step(self, text: str) -> str:
        return self._grade(text)

    def final_answer(self, text: str) -> None:
        self._grade(text)
        self.done = True

    def check(self, text: str) -> str:
        """Check a piece of text.

        Args:
            text: The text.
        """
        return self._grade(text)

    def _grade(self, text: str) -> str:
        if "bug" in text:
            raise toolgym.EnvironmentBug("the grader's data file is missing")
        return text.split()[0]  # IndexError on blank text: the model chose it


class FragileChat(Fragile):
    """`Fragile` over chat tool calls (no inline markers)."""

    inline_markers: ClassVar[tuple[str, ...]] = ()
