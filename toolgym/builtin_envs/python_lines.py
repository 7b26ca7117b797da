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

from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.envs.calls import EPISODE_OVER
from toolgym.envs.inline import InlineStep


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

    def reset(
        self,
        task: str | None = None,
        answer: str | None = None,
        solution: list[str] | None = None,
    ) -> str | None:
        """Start a fresh session; `task` is shown to the model, `answer` grades `submit`,
        `solution` (lines an expert writes) is the demonstration."""
        self.pending, self.submitted, self.solution = "", None, solution
        return super().reset(task=task, answer=answer)

    def demonstration(self) -> list[str] | None:
        """The row's solution lines (each ending with a newline), or None."""
        return [
            line if line.endswith("\n") else line + "\n" for line in self.solution or []
        ] or None

    def inline_step(self, text: str) -> InlineStep:
        """Run the statement this line completes; its output is the observation. Once the
        episode is done (after `submit`), nothing runs and nothing is graded again."""
        if self.done:
            return InlineStep(f"{EPISODE_OVER}\n", done=True, failed=True)
        self.pending += text if text.endswith("\n") else text + "\n"
        source = self.pending
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SyntaxWarning)
                # as the console does: without the last newline, an open block stays open
                compiled = codeop.compile_command(source[:-1], "<line>", "single")
        except Exception as error:  # SyntaxError, or what huge input makes codeop raise
            self.pending = ""
            return InlineStep(f"{_first_line(error)}\n", self.error_reward, failed=True)
        if compiled is None:
            return InlineStep()  # an open block (or only comments so far): wait for more
        self.pending = ""
        if not source.strip() or _only_comments(source):
            return InlineStep()
        argument = _submitted_expression(source)
        if argument is not None:
            return self._submit(argument)
        return self._run(source)

    def final_answer(self, text: str) -> None:
        """The model ended its turn: a last line it did not end with a newline still runs (a
        final `submit(...)` counts); plain text is never graded."""
        if text.strip():
            self.inline_step(text)

    def _run(self, source: str) -> InlineStep:
        try:
            output = self._session().run(source)
        except Exception as error:  # the session cannot start again (the model's code can
            # kill what starts sessions): this episode's step fails, the run goes on
            return InlineStep(f"session: {error}\n", self.error_reward, failed=True)
        failed = bool(output.stderr and "Traceback" in output.stderr) or output.ended is not None
        lines = [output.stdout.rstrip("\n")] if output.stdout else []
        if output.value is not None:
            lines.append(output.value)
        if output.stderr.strip():  # a traceback's last line; `print(file=sys.stderr)` none
            lines.append(output.stderr.strip().splitlines()[-1])
        if output.ended:
            lines.append(f"session: {output.ended}")
        observation = "".join(f"{line}\n" for line in lines if line) or None
        return InlineStep(observation, self.error_reward if failed else 0.0, failed=failed)

    def _submit(self, argument: str) -> InlineStep:
        if self.done or self.submitted is not None:  # graders grade once
            return InlineStep(f"{EPISODE_OVER}\n", done=True, failed=True)
        try:
            output = self._session().run(argument)
        except Exception as error:
            return InlineStep(f"submit failed: {error}\n", self.error_reward, failed=True)
        if output.value is None:
            why = output.stderr.strip().splitlines()[-1] if output.stderr.strip() else "no value"
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
    except Exception:  # SyntaxError, or MemoryError / RecursionError of a deep expression
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
    """A submitted value as text: strings without their quotes, numbers as written. The repr
    is the model's (its object's `__repr__`): what cannot be read back as a literal (a
    syntax error, an unhashable key, a nesting deep enough for MemoryError or RecursionError
    in the parser) is taken as written."""
    try:
        value = ast.literal_eval(value_repr)
        return str(value).strip()
    except Exception:
        return value_repr.strip()


def _first_line(error: BaseException) -> str:
    """`Type: message` of an error (a SyntaxError's message without its place), the first
    line only; an error without a message is its type alone."""
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    message = text.strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


_PROBLEMS = (
    (
        "A shop has {a} boxes of {b} apples and sells {c} apples. How many apples are left?",
        ["boxes = {a}", "per_box = {b}", "sold = {c}", "left = boxes * per_box - sold"],
        lambda a, b, c: a * b - c,
    ),
    (
        "A ticket costs {a} dollars. A group buys {b} tickets and pays {c} dollars in fees. "
        "What do they pay in total?",
        ["price = {a}", "tickets = {b}", "fees = {c}", "total = price * tickets + fees"],
        lambda a, b, c: a * b + c,
    ),
    (
        "A train runs {a} km, then {b} km more, and repeats the whole trip {c} times. "
        "How many km does it run?",
        ["trip = {a} + {b}", "times = {c}", "total = trip * times"],
        lambda a, b, c: (a + b) * c,
    ),
)


def python_lines_dataset(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Arithmetic word problems (three kinds) that a few lines of Python solve, with the
    lines an expert writes (`solution`) for warm-up demonstrations."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, lines, answer = rng.choice(_PROBLEMS)
        a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(10, 500)
        task = (
            f"{question.format(a=a, b=b, c=c)} Write Python one line at a time; each line runs "
            "as you write it and you see its output. End with submit(<expression>)."
        )
        result = lines[-1].split(" = ")[0]
        solution = [line.format(a=a, b=b, c=c) for line in lines]
        solution += [f"print({result})", f"submit({result})"]
        rows.append(
            {
                "prompt": [{"role": "user", "content": task}],
                "answer": str(answer(a, b, c)),
                "solution": solution,
            }
        )
    return rows
