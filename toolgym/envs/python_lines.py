"""`PythonLines-v0`: the inline protocol in a live REPL. The model writes Python line by line
in one assistant turn; each complete statement runs the moment its line ends, and what it
printed (or the last line of its traceback) is appended inline, as in an interactive console.
A statement that raises earns a per-step reward (`error_reward`, -0.3 by default), and
`submit(expression)` written as a line ends the episode, graded against the row's answer.

Comments are the model's own words: a line holding only a comment runs nothing and gets no
observation. Lines that open a block (`for ...:`) are held until the block is complete, as
Python's console does (`codeop`): an empty line ends a block. Model code runs in a
`PythonSession` (a process of its own), and the registered environment defaults to the
strongest sandbox available.
"""

from __future__ import annotations

import ast
import codeop
import warnings
from typing import Any, ClassVar

from toolgym.envs.inline import InlineStep
from toolgym.envs.python_repl import PythonREPL


class PythonLines(PythonREPL):
    """A persistent Python namespace driven line by line through the inline protocol.

    Args:
        max_turns: Lines (generations) before the episode is truncated.
        error_reward: The step reward of a statement that raises (or does not compile).
        output_limit: Characters kept per stream.
        run_timeout: Seconds one statement may run.
    """

    inline_markers: ClassVar[tuple[str, ...]] = ("\n",)

    def __init__(
        self,
        max_turns: int = 24,
        error_reward: float = -0.3,
        output_limit: int = 2_000,
        run_timeout: float = 10.0,
    ) -> None:
        super().__init__(max_turns, output_limit, run_timeout)
        self.error_reward = error_reward
        self.pending = ""
        self.submitted: str | None = None

    def reset(self, task: str | None = None, answer: str | None = None) -> str | None:
        """Start a fresh session; `task` is shown to the model, `answer` grades `submit`."""
        self.pending, self.submitted = "", None
        return super().reset(task=task, answer=answer)

    def inline_step(self, text: str) -> InlineStep:
        """Run the statement this line completes; its output is the observation."""
        self.pending += text if text.endswith("\n") else text + "\n"
        source = self.pending
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SyntaxWarning)
                # as the console does: without the last newline, an open block stays open
                compiled = codeop.compile_command(source[:-1], "<line>", "single")
        except (SyntaxError, ValueError, OverflowError) as error:
            self.pending = ""
            return InlineStep(
                f"{type(error).__name__}: {error.args[0]}\n", self.error_reward, failed=True
            )
        if compiled is None:
            return InlineStep()  # an open block (or only comments so far): wait for more
        self.pending = ""
        if not source.strip() or _only_comments(source):
            return InlineStep()
        argument = _submitted_expression(source)
        if argument is not None:
            return self._submit(argument)
        return self._run(source)

    def _run(self, source: str) -> InlineStep:
        output = self.session.run(source)
        failed = bool(output.stderr and "Traceback" in output.stderr) or output.ended is not None
        lines = [output.stdout.rstrip("\n")] if output.stdout else []
        if output.value is not None:
            lines.append(output.value)
        if output.stderr:
            lines.append(output.stderr.rstrip("\n").splitlines()[-1])
        if output.ended:
            lines.append(f"session: {output.ended}")
        observation = "".join(f"{line}\n" for line in lines if line) or None
        return InlineStep(observation, self.error_reward if failed else 0.0, failed=failed)

    def _submit(self, argument: str) -> InlineStep:
        output = self.session.run(argument)
        if output.value is None:
            why = output.stderr.strip().splitlines()[-1] if output.stderr else "no value"
            return InlineStep(f"submit failed: {why}\n", self.error_reward, failed=True)
        self.submitted = _plain(output.value)
        self.done = True
        if self.answer is not None:
            self.reward = float(self.submitted == self.answer.strip())
        return InlineStep(f"submitted {self.submitted}\n", done=True)


def _only_comments(source: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("#") for line in source.splitlines())


def _submitted_expression(source: str) -> str | None:
    """The argument's source when the statement is `submit(<expression>)`, else None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        return None
    if call.func.id != "submit" or len(call.args) != 1 or call.keywords:
        return None
    return ast.get_source_segment(source, call.args[0])


def _plain(value_repr: str) -> str:
    """A submitted value as text: strings without their quotes, numbers as written."""
    try:
        value = ast.literal_eval(value_repr)
    except (ValueError, SyntaxError):
        return value_repr.strip()
    return str(value).strip()


def python_lines_dataset(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Arithmetic word problems whose answers are easiest to compute with a few lines."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        boxes, per_box, eaten = rng.randint(12, 99), rng.randint(12, 99), rng.randint(10, 500)
        task = (
            f"A shop has {boxes} boxes of {per_box} apples and sells {eaten} apples. How many "
            "apples are left? Write Python one line at a time; each line runs as you write it. "
            "End with submit(<expression>)."
        )
        rows.append(
            {"prompt": [{"role": "user", "content": task}], "answer": str(boxes * per_box - eaten)}
        )
    return rows
