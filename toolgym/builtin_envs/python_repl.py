"""`PythonREPL-v0`: a stateful Python session the model drives with one tool, `run(code)`.

Model-written code runs here: in a session process of its own (`toolgym.sandbox.python_session`),
and the registered environment defaults to the strongest sandbox available
(`toolgym.sandbox.strongest_backend()`: docker, else process). Standard library only, so it
runs inside the minimal worker image.
"""

from __future__ import annotations

from typing import Any

from toolgym.envs.calls import EPISODE_OVER, ToolError
from toolgym.envs.core import Environment
from toolgym.envs.snapshots import NotForkable
from toolgym.sandbox.python_session import (
    OUTPUT_LIMIT,
    PythonSession,
    SessionImageError,
    SessionStartError,
)


class PythonREPL(Environment):
    """A persistent Python namespace; each `run` sees what earlier calls defined.

    The model's code runs in a `PythonSession`: a process of its own with no handle on this
    object (the expected answer, the reward) or on the sandbox's protocol channel. Code that
    runs past `run_timeout`, exits or crashes ends the session; the model reads why, and its
    next `run` starts a fresh namespace.

    Args:
        max_turns: Turns before the episode is truncated.
        output_limit: Characters kept per stream (see `OUTPUT_LIMIT`).
        run_timeout: Seconds one `run` may take (keep it below the sandbox's call timeout,
            30 s by default, so the model reads the timeout instead of losing the episode).
    """

    runs_model_code = True
    """Model code runs here (in sessions this object starts): a sandbox pool gives each
    episode a fresh worker, so nothing one episode's code left behind (files in /tmp, a killed
    session zygote) reaches the next; the process backend starts a session zygote."""

    def __init__(
        self, max_turns: int = 16, output_limit: int = OUTPUT_LIMIT, run_timeout: float = 10.0
    ) -> None:
        self.max_turns = max_turns
        self.output_limit, self.run_timeout = output_limit, run_timeout
        self.session: PythonSession | None = None
        self.task: str | None = None
        self.answer: str | None = None

    def reset(self, task: str | None = None, answer: str | None = None) -> str | None:
        """Start with a fresh session; `task` is shown to the model, `answer` grades it."""
        self.close()
        self.session = PythonSession(self.run_timeout, self.output_limit)
        self.task, self.answer = task, answer
        return task

    def run(self, code: str) -> str:
        """Run Python code in the session and return its output.

        Args:
            code: Python statements; the value of a final expression is shown like in a REPL.
        """
        if self.done:
            raise ToolError(f"{EPISODE_OVER}; no more code runs")
        try:
            output = self._session().run(code)
        except SessionStartError as error:  # the model's code killed what starts sessions
            raise ToolError(f"no session could start: {error}") from None
        parts = [f"stdout:\n{output.stdout}"]
        if output.stderr:
            parts.append(f"stderr:\n{output.stderr}")
        if output.value is not None:
            parts.append(f"value: {output.value}")
        if output.ended:
            parts.append(f"session: {output.ended}")
        return "\n".join(parts)

    def _session(self) -> PythonSession:
        """The episode's session (`reset` starts it)."""
        if self.session is None:
            raise RuntimeError("call reset() before run()")
        return self.session

    def final_answer(self, text: str) -> None:
        """Grade the model's answer against the row's, once: after the episode is done, a
        later answer changes nothing."""
        if self.answer is not None and not self.done:
            self.reward = float(text.strip() == self.answer.strip())
            self.done = True

    def snapshot_state(self) -> dict[str, Any]:
        """What a snapshot keeps: this object's attributes, and the session's namespace as
        an image (`PythonSession.image`: variables, functions, classes, imported modules and
        the files in its working folder; not threads it started). Raises `NotForkable` naming
        what the image cannot carry."""
        state = {name: value for name, value in vars(self).items() if name != "session"}
        try:
            state["session_image"] = self.session.image() if self.session is not None else None
        except SessionImageError as error:
            raise NotForkable(f"{type(self).__name__}'s session: {error}") from None
        return state

    def restore_state(self, state: dict[str, Any]) -> None:
        """Back to a `snapshot_state`: a new session holding the image's names (a fork's
        session is its own process; the session this object had is left to its owner)."""
        image = state.pop("session_image", None)
        session = PythonSession(state["run_timeout"], state["output_limit"])
        if image is not None:  # first: a load that fails leaves this object as it was
            try:
                session.load_image(image)
            except SessionImageError as error:
                raise NotForkable(f"{type(self).__name__}'s session: {error}") from None
        vars(self).update(state)
        self.session = session

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


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
