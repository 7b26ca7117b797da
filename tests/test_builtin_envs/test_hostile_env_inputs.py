"""The built-in environments never raise on the model's input (issue 43 item 5), property
style: hostile tool arguments, code, lines and final answers go to every built-in environment
(Wordle, Arithmetic, GuessNumber, PythonREPL, PythonLines), locally and in process and docker
sandboxes.
Whatever the model sends, each call is answered without an exception escaping the environment:
no `tool_exception` or `bad_result` (the environment's own code failing on the input), no
episode ended by a crash, and the reward stays a finite number.

Examples are derandomized, so every machine runs the same ones."""

from __future__ import annotations

import math
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolgym

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"


def _docker_ready() -> bool:
    from toolgym.sandbox.docker import docker_ready

    return docker_ready()


BACKENDS = [
    "local",
    pytest.param(
        "process",
        marks=pytest.mark.skipif(
            not REQUIRED and shutil.which("bwrap") is None, reason="bubblewrap is not installed"
        ),
    ),
    pytest.param(
        "docker",
        marks=[
            pytest.mark.docker,
            pytest.mark.skipif(
                not REQUIRED and not _docker_ready(), reason="no Docker daemon or sandbox image"
            ),
        ],
    ),
]

DEEP = "-[" * 600 + "1" + "]" * 600
"""A literal deep enough for MemoryError in Python's parser (`ast.literal_eval`)."""

CODE = [
    "import sys\nprint(file=sys.stderr)",
    "import sys\nsys.stderr.write(' \\n')",
    "import sys\nsubmit(print(' ', file=sys.stderr))",
    f"class D:\n    def __repr__(self): return {DEEP!r}\nD()",
    "class S:\n    def __repr__(self): return '{{}}'\nS()",
    "class R:\n    def __repr__(self): raise ValueError('no repr')\nR()",
    "class E(Exception):\n    def __str__(self): raise ValueError('no str')\nraise E()",
    "10 ** 5000",
    "raise SystemExit(3)",
    "raise KeyboardInterrupt",
    "import os; os._exit(0)",
    "def f(): return f()\nf()",
    "print('\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\udcff')",
    "print('x' * 100000)",
    "import sys; sys.stdout = None",
    "''.join(chr(c) for c in range(0xd800, 0xd810))",
    "import threading; threading.Thread(target=lambda: None).start()",
    "\x00",
    "",
]
"""Code a hostile model writes (to PythonREPL's `run`, and line by line to PythonLines)."""

TEXT = [
    " ",
    "\n",
    "",
    "\x00\x1b[2J\x9b\udcff",
    DEEP,
    "9" * 5000,
    "1e999",
    "-1e999",
    "nan",
    "1,,,,,,.5",
    "submit(",
    "submit()",
    "submit(1, 2)",
    f"submit({DEEP})",
    "ＣＲＡＮＥ",
    "c r a n e",
    "ß" * 5,
    "crane" * 1000,
]
"""Answers and words."""

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
texts = st.sampled_from(TEXT + CODE) | st.text(max_size=60)
values = texts | json_values


@st.composite
def calls(draw: st.DrawFn, tools: list[dict]) -> toolgym.ToolCall:
    """A call to one of the tools (or another name): hostile values for its parameters, an
    extra argument now and then, or the arguments as raw text."""
    names = [tool["function"]["name"] for tool in tools]
    name = draw(st.sampled_from(names) | st.text(max_size=12))
    tool = next((t for t in tools if t["function"]["name"] == name), None)
    parameters = list(tool["function"]["parameters"]["properties"]) if tool else []
    if draw(st.integers(0, 9)) == 0:
        return toolgym.ToolCall(name, draw(st.text(max_size=60)))  # raw, maybe broken, JSON
    arguments = {p: draw(st.sampled_from(CODE) | values) for p in parameters}
    arguments |= draw(st.dictionaries(st.text(max_size=6), json_values, max_size=1))
    return toolgym.ToolCall(name, arguments)


CHAT_ENVS = {
    "Wordle-v0": {},
    "Arithmetic-v0": {},
    "GuessNumber-v0": {},
    "PythonREPL-v0": {"run_timeout": 2.0},
}
"""The chat environments and the constructor arguments under test (PythonREPL's timeout
short, so a hostile loop costs 2 s)."""


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


@pytest.mark.parametrize("env_id", sorted(CHAT_ENVS))
def test_no_tool_call_or_answer_raises_in_a_chat_environment(backend, env_id):
    env = toolgym.make(env_id, sandbox=backend, **CHAT_ENVS[env_id])
    row = {k: v for k, v in toolgym.spec(env_id).dataset(1, seed=0)[0].items() if k != "prompt"}
    code_runner = env_id == "PythonREPL-v0"
    examples = (25 if backend == "local" else 12) if code_runner else 60

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(calls(env.tools), min_size=1, max_size=3), texts)
    def episode(turn: list[toolgym.ToolCall], answer: str) -> None:
        env.reset(seed=0, **row)
        step = env.step(turn)
        failures = {r.failure for r in step.results}
        assert not failures & {"tool_exception", "bad_result"}, step.messages
        assert step.info["ended"] is None, step.info["error"]
        env.final_answer(answer)
        reward = env.get_reward()
        assert reward is None or math.isfinite(reward)
        assert all(math.isfinite(v) for v in env.episode_metrics().values())

    try:
        episode()
    finally:
        env.close()


def test_no_line_or_answer_raises_in_python_lines(backend):
    env = toolgym.make("PythonLines-v0", sandbox=backend, run_timeout=2.0)
    lines = st.sampled_from(CODE + TEXT).map(lambda code: code + "\n") | st.text(max_size=40)

    @settings(
        max_examples=30 if backend == "local" else 12,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(lines, min_size=1, max_size=6), texts)
    def episode(written: list[str], answer: str) -> None:
        env.reset(seed=0, task="t", answer="1")
        for text in written:
            step = env.inline_step(text)
            assert step.reward is None or math.isfinite(step.reward)
        env.final_answer(answer)
        assert math.isfinite(env.get_reward())

    try:
        episode()
    finally:
        env.close()


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_every_hostile_code_line_reaches_both_pythons_once(backend):
    """Each entry of `CODE` once (hypothesis may not draw them all), in PythonREPL's `run` and
    line by line in PythonLines, then as their answers."""
    repl = toolgym.make("PythonREPL-v0", sandbox=backend, run_timeout=2.0)
    lines = toolgym.make("PythonLines-v0", sandbox=backend, run_timeout=2.0)
    try:
        for code in CODE:
            repl.reset(seed=0, task="t", answer="1")
            step = repl.step(toolgym.ToolCall("run", {"code": code}))
            assert step.results[0].ok and step.info["ended"] is None, (code, step.messages)
            repl.final_answer(code)
            lines.reset(seed=0, task="t", answer="1")
            for line in [*code.splitlines(keepends=True), "\n", f"submit({code!r})\n"]:
                lines.inline_step(line)
            lines.final_answer(code)
            assert lines.get_reward() in (0.0, 1.0)
    finally:
        repl.close()
        lines.close()


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


VALUES = [float("nan"), float("inf"), -0.0, True, None, _nested(5000), {"": []}]
VALUES += [*TEXT, "x" * 1_000_000]
"""Argument values each tool gets once, in every parameter (hypothesis may not draw them)."""

HUGE_INT = 10**5000
"""An int past str()'s 4,300 digits, tried locally only: the model's JSON cannot carry it
(`json.loads` refuses it), only Python code can, and a sandbox's host cannot send it to its
worker (the episode ends `tool_crash`)."""


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.parametrize("env_id", sorted(CHAT_ENVS))
def test_every_hostile_value_reaches_every_tool_parameter_once(backend, env_id):
    env = toolgym.make(env_id, sandbox=backend, **CHAT_ENVS[env_id])
    row = {k: v for k, v in toolgym.spec(env_id).dataset(1, seed=0)[0].items() if k != "prompt"}
    try:
        for tool in env.tools:
            name, parameters = tool["function"]["name"], tool["function"]["parameters"]
            raw = ["[" * 100_000, '{"a": ' * 50_000, "\ud800", "9" * 5000]
            tried = [*VALUES, HUGE_INT] if backend == "local" else VALUES
            for arguments in [*({p: v for p in parameters["properties"]} for v in tried), *raw]:
                env.reset(seed=0, **row)
                step = env.step(toolgym.ToolCall(name, arguments))
                failures = {r.failure for r in step.results}
                assert not failures & {"tool_exception", "bad_result"}, step.messages
                assert step.info["ended"] is None, step.info["error"]
    finally:
        env.close()
