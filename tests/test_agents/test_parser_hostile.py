"""Every parser is linear (or bounded) on hostile text, reads at most `MAX_CALLS` calls per
message, and lets a caller's time limit through.

The budget per parse of 1 MB is generous (10 s; the parsers take well under 1 s on a shared
2-core machine) and far below the quadratic time these texts took before (minutes to hours at
1 MB). Speed itself is measured by `bench/parsers.py --hostile`, never asserted here.
"""

from __future__ import annotations

import ast
import gc
import re
import signal
import time

import pytest
from hostile_text import hostile_texts
from hypothesis import given, settings
from hypothesis import strategies as st

from toolgym import MalformedToolCall, ToolCall
from toolgym.agents.parsers import FORMATS, PARSERS, PLAIN_PARSERS, ParsedMessage
from toolgym.agents.parsers.base import MAX_CALLS, Scan, too_many_calls
from toolgym.agents.parsers.call_syntax import _Segments
from toolgym.agents.parsers.formats import _never_raises
from toolgym.agents.parsers.xml_formats import _glm_arguments, _parameters, function_blocks

BUDGET_S = 10.0
SIZE = 1 << 20


def _unique(parsers: dict) -> dict[str, object]:
    """One entry per distinct parser, named by all its names."""
    names: dict[int, list[str]] = {}
    for name, parser in parsers.items():
        names.setdefault(id(parser), []).append(name)
    return {"/".join(found): parsers[found[0]] for found in names.values()}


UNIQUE = _unique(PARSERS)


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return hostile_texts(SIZE)


def _well_formed(parsed: object) -> None:
    assert isinstance(parsed, ParsedMessage)
    assert isinstance(parsed.content, str) and isinstance(parsed.reasoning, str)
    assert len(parsed.tool_calls) <= MAX_CALLS + 1
    for call in parsed.tool_calls:
        assert isinstance(call, (ToolCall, MalformedToolCall))
        if isinstance(call, MalformedToolCall):
            assert isinstance(call.reason, str) and call.reason


@pytest.mark.parametrize("name", sorted(UNIQUE))
def test_each_parser_reads_each_hostile_megabyte_within_budget(name, texts):
    parser = UNIQUE[name]
    over = {}
    for label, text in texts.items():
        start = time.perf_counter()
        parsed = parser(text)
        seconds = time.perf_counter() - start
        _well_formed(parsed)
        if seconds > BUDGET_S:
            over[label] = round(seconds, 1)
    assert not over, f"{name} over {BUDGET_S} s on 1 MB: {over}"


def test_the_plain_parsers_read_hostile_think_blocks_within_budget(texts):
    thinking = {k: v for k, v in texts.items() if "think" in k or "example in" in k}
    assert thinking
    for name, parser in _unique(PLAIN_PARSERS).items():
        for label, text in thinking.items():
            start = time.perf_counter()
            _well_formed(parser(text))
            assert time.perf_counter() - start < BUDGET_S, (name, label)


# -- the cap on calls per message --------------------------------------------------------------
def _repeated(name: str, count: int) -> str:
    example = FORMATS[name].example
    return "; ".join([example] * count) if name == "llama3" else example * count


def _reads_repeats(name: str) -> bool:
    """The format's example written twice reads as its call twice."""
    one = PARSERS[name](FORMATS[name].example).tool_calls
    return PARSERS[name](_repeated(name, 2)).tool_calls == one * 2


REPEATABLE = [name for name in FORMATS if _reads_repeats(name)]


def test_most_formats_read_a_repeated_call_as_calls():
    assert len(REPEATABLE) >= 15, REPEATABLE


@pytest.mark.parametrize("name", REPEATABLE)
def test_a_message_reads_at_most_max_calls_and_says_so(name):
    one = PARSERS[name](FORMATS[name].example).tool_calls
    parsed = PARSERS[name](_repeated(name, MAX_CALLS + 200))
    assert parsed.tool_calls[:MAX_CALLS] == one * MAX_CALLS
    [marker] = parsed.tool_calls[MAX_CALLS:]
    assert isinstance(marker, MalformedToolCall) and marker.reason == too_many_calls()
    exactly = PARSERS[name](_repeated(name, MAX_CALLS)).tool_calls
    assert exactly == one * MAX_CALLS  # no marker at the cap itself


def test_a_long_pythonic_list_reads_its_first_calls_exactly():
    items = [
        "f(s='a, b)', n=[1, (2, 3)])",
        'g(t="x]\\"y", u={"k": "#"})',
        "h(v='''multi\nline, ]''')",
        "k()  # a comment, with a ] bracket\n",
    ]
    calls = [items[i % len(items)] for i in range(MAX_CALLS + 50)]
    source = "[" + ", ".join(calls) + "]"
    parsed = PARSERS["pythonic"](source)
    expected = PARSERS["pythonic"]("[" + ", ".join(calls[:MAX_CALLS]) + "]").tool_calls
    assert all(isinstance(c, ToolCall) for c in expected) and len(expected) == MAX_CALLS
    assert parsed.tool_calls[:MAX_CALLS] == expected
    assert parsed.tool_calls[MAX_CALLS].reason == too_many_calls()
    lfm2 = PARSERS["lfm2"]("<|tool_call_start|>" + source + "<|tool_call_end|>")
    assert lfm2.tool_calls[:MAX_CALLS] == expected
    assert [c.reason for c in lfm2.tool_calls[MAX_CALLS:]] == [too_many_calls()]


# -- a caller's time limit passes through ------------------------------------------------------
class _Alarm(Exception):
    """A caller's own time-limit exception (not TimeoutError)."""


@pytest.mark.parametrize("error", [TimeoutError, _Alarm, KeyboardInterrupt])
def test_the_backstop_lets_what_is_not_the_texts_doing_through(error):
    def reader(text: str) -> ParsedMessage:
        raise error("time is up")

    with pytest.raises(error):
        _never_raises(reader)("<tool_call>")


@pytest.mark.parametrize("error", [ValueError, KeyError, TypeError, RecursionError, MemoryError])
def test_the_backstop_turns_reading_errors_into_a_malformed_call(error):
    def reader(text: str) -> ParsedMessage:
        raise error("bad text")

    parsed = _never_raises(reader)("<tool_call>")
    assert [c.reason for c in parsed.tool_calls] == [f"unreadable tool call ({error.__name__})"]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
@pytest.mark.parametrize("name", sorted(UNIQUE))
def test_an_alarm_during_a_parse_reaches_the_caller(name):
    text = _repeated(name.split("/")[0], 2000) if name.split("/")[0] in FORMATS else "x"

    def expire(signum, frame):
        raise TimeoutError("parse took too long")

    previous = signal.signal(signal.SIGALRM, expire)
    # The collector off: a signal that arrives during a collection is handled in the first
    # Python code after it, a gc callback (hypothesis installs one once its tests have run),
    # where the exception is lost; the parser's own code is what this test is about.
    gc.disable()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        deadline = time.monotonic() + 5
        with pytest.raises(TimeoutError):
            while time.monotonic() < deadline:
                UNIQUE[name](text)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        gc.enable()


# -- the forward scans find what the regexes they replace found ---------------------------------
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_GLM_ARGUMENT = re.compile(
    r"<arg_key(?::\w+)?>(.*?)</arg_key(?::\w+)?>\s*<arg_value(?::\w+)?>(.*?)(?:</arg_value(?::\w+)?>|\Z)",
    re.DOTALL,
)
_PIECES = [
    "<function=",
    "f",
    ">",
    "\n",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<arg_key:x>",
    "</arg_value:y>",
    " ",
    "v",
    "<",
]
_texts = st.lists(st.sampled_from(_PIECES), max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_function_blocks_match_the_regex(text):
    expected = [(*m.groups()[:2], bool(m.group(3)), m.group(0)) for m in _FUNCTION.finditer(text)]
    assert list(function_blocks(text)) == expected


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_parameters_match_the_regex(text):
    assert list(_parameters(text)) == _PARAMETER.findall(text)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_glm_arguments_match_the_regex(text):
    assert list(_glm_arguments(text)) == _GLM_ARGUMENT.findall(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "é", "\n", "\r\n", "\r", "\x0c", "😀", "b"]), max_size=8))
def test_segments_match_ast(parts):
    source = (
        "[f(x='"
        + "".join(parts).replace("\r", "")
        + "'),\n g(y=1)\r\n, h(z='''"
        + "".join(parts)
        + "''')]"
    )
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        return
    segments = _Segments(source)
    for node in ast.walk(tree):
        assert segments.of(node) == ast.get_source_segment(source, node)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab<>", max_size=30), st.lists(st.integers(0, 35), max_size=12))
def test_scan_answers_as_str_find_from_any_start(text, starts):
    scan = Scan(text)
    pattern = re.compile(r"<a+>")
    for start in starts:
        for needle in ("a", "<", "ab>", "zz"):
            assert scan.find(needle, start) == text.find(needle, start)
        found = scan.search(pattern, start)
        expected = pattern.search(text, start)
        assert (found and found.span()) == (expected and expected.span())


# -- the formats from vLLM's example templates, on their own markers -----------------------------
NEW_UNITS = (
    "functools[",
    "functools[{",
    '{"name": "f", "arguments": {\'a\': 1}}',
    '{"name": "f", "arguments": {\'a\': ',
    "{'",
    '{"',
    "[{",
    "{",
    "<|action_start|><|plugin|>",
    '<|action_start|><|plugin|>{"name": "f", "arguments": {}}',
    "<function_call>",
    "<function_call> {",
    "<start_function_call>",
    "<start_function_call>call:f{",
    "<escape>",
    ">>>",
    ">>>f\n{",
    ">>>f\n{}",
    "<|python_start|>",
    "<|python_start|>[f(",
    "<function_calls>",
    "<function_calls>\nf(x=1)\n",
    "f(x=1)\n",
)
# OLMo 3's calls one per line, a megabyte of them after one marker (one- and multi-line calls)
LINES = (
    "<function_calls>\n" + "f(x=1)\n" * (SIZE // 7),
    "<function_calls>\n" + "f(x='''a\n\n''')\n" * (SIZE // 14),
)
NEW_FORMATS = ("json_calls", "internlm2", "granite_20b_fc", "functiongemma", "functionary_v32")


@pytest.mark.parametrize("name", [*NEW_FORMATS, "pythonic"])
def test_the_new_formats_read_a_hostile_megabyte_of_their_markers_within_budget(name):
    over = {}
    for unit in NEW_UNITS:
        for text in (unit * (SIZE // len(unit)), "{" * (SIZE // 2) + unit, unit + "'" * SIZE):
            start = time.perf_counter()
            _well_formed(PARSERS[name](text))
            if (seconds := time.perf_counter() - start) > BUDGET_S:
                over[unit] = round(seconds, 1)
    assert not over, f"{name} over {BUDGET_S} s on 1 MB: {over}"


def test_pythonic_reads_a_megabyte_of_calls_one_per_line_within_budget():
    for text in LINES:
        start = time.perf_counter()
        parsed = PARSERS["olmo3"](text[:SIZE])
        assert time.perf_counter() - start < BUDGET_S
        assert parsed.tool_calls[-1].reason == too_many_calls()


def test_the_new_formats_are_in_the_hostile_set():
    assert all(any(name in key.split("/") for key in UNIQUE) for name in NEW_FORMATS)
