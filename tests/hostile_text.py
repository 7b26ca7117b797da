"""Hostile model text for the tool-call parsers: the shapes a degenerate or adversarial
generation takes (an opening marker repeated with no close, a long list of calls, deep nesting,
many unterminated JSON objects), each grown to a given size.

`HOSTILE` maps a short label to `build(size)`; `hostile_texts(size)` builds them all. Shared by
`tests/test_agents/test_parser_hostile.py` (each parser within a time budget) and `bench/parsers.py
--hostile` (the worst time per parser against a linear baseline).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from toolgym.agents.parsers import FORMATS

# Every format's opening markers, and the pieces of a call that a scan may search from.
MARKERS = (
    "<tool_call>",
    "<tool_call:x>",
    "<function=",
    "<function=f>",
    "<parameter=",
    "<parameter=k>",
    '<invoke name="',
    '<invoke name="f">',
    '<parameter name="k">',
    '<parameter name="k"',
    "<aaaaaaaaaaaaaaaa",
    "<arg_key>",
    "<arg_key>k</arg_key>",
    "<arg_value>",
    "<|tool_call>",
    "<|tool_call>call:f{",
    '<|"|>',
    "<|channel>thought",
    "<|tool_call_start|>",
    "<|tool_call_start|>[",
    "[TOOL_CALLS]",
    "[TOOL_CALLS]f[ARGS]",
    "[ARGS]",
    "[CALL_ID]",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call:begin|>",
    "<|tool_call:name|>",
    "<|tool_call:args|>",
    "<|message|>",
    "to=functions.f",
    "<|channel|>analysis<|message|>",
    "<tool_calls>",
    "<TOOLCALL>",
    "<|tool_call|>",
    "<|START_ACTION|>",
    "<|function_call|>",
    "function call<|role_sep|>",
    "<|tools_prefix|>",
    "<|python_tag|>",
    "<think>",
    "</think>",
    "<think></think>",
)

# Repeated units: call lists, unterminated JSON, and the closing marker of one format with
# the others missing.
UNITS = (
    '{"name": ',
    '{"name": "f", "arguments": {',
    '{"name": "f", "arguments": {}}',
    '{"name": "f", "arguments": {}};',
    '{"name": "f"\n',
    '{"a": 1, ',
    '{"a": "',
    '"\\',
    "f(x=1), ",
    "f(x=[1, {'a': (1, 2)}]), ",
    "call:f{x:1}",
    "a:{",
    "<|message|>x<|call|>",
    "<|message|>x<|end|>",
    "to=functions.f<|message|>{}<|call|>",
    "<parameter=k>v</parameter>",
    "<arg_key>k</arg_key><arg_value>v</arg_value>",
    '<parameter name="k">v</parameter>',
    "<|tool_call:begin|>i<|tool_call:name|>",
    "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>",
    "<｜tool▁call▁begin｜>f<｜tool▁sep｜>",
    "<tool_call>{}</tool_call>",
    "<tool_call>f</tool_call>",
    "[TOOL_CALLS]f[ARGS]{}",
    '<|"|>x<|"|>,',
    "<|tool_call>call:f{}<tool_call|>",
    "<|tool_call_start|>[f()]<|tool_call_end|>",
    "<|tools_prefix|>[]<|tools_suffix|>",
)

# Deep nesting: (prefix, repeated unit): the prefix opens a call, the unit nests.
NESTING = (
    ("", "["),
    ("", "{"),
    ("", "("),
    ("", '{"a":'),
    ("", '[{"a":'),
    ("<tool_call>", "["),
    ("<tool_call>", '{"a":'),
    ("[TOOL_CALLS]", "["),
    ("[TOOL_CALLS]f[ARGS]", '{"a":'),
    ("<|python_tag|>", '{"a":'),
    ("[f(x=", "["),
    ("[f(x=", "-"),
    ("[f(x=", "not "),
    ("[f(x=", "("),
    ("[", "a."),
    ("<|tool_call_start|>[f(x=", "["),
    ("<|tool_call>call:f{", "a:{"),
    ("<|tool_call>call:f{x:", "["),
    ("<function=f>", "<parameter="),
    ("<tool_call>f", "<arg_key>"),
    ("<function=f>", '{"a":'),
    ("<｜tool▁call▁begin｜>f<｜tool▁sep｜>", '{"a":'),
    ("<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>", "["),
    ("to=functions.f<|message|>", "["),
)

# Inside one closed call: (opening, repeated unit, closing).
CLOSED = (
    ("<function=f>", "<parameter=", "</function>"),
    ("<function=f>", "<parameter=k>", "</function>"),
    ("<function=f>", "</parameter>", "</function>"),
    ("<tool_call>f", "<arg_key>", "</tool_call>"),
    ("<tool_call>f", "<arg_key>k</arg_key>", "</tool_call>"),
    ("<tool_call>f", "<arg_key>k</arg_key><arg_value>", "</tool_call>"),
    ("<tool_call>f", "</arg_key>", "</tool_call>"),
    ("<tool_call:x>f", "<tool_call:x>", "</tool_call:x>"),
    ('<invoke name="f">', '<parameter name="k"', "</invoke>"),
    ('<invoke name="f">', '<parameter name="k">', "</invoke>"),
    ('<invoke name="f">', "</aaaaaaaaaaaaaaaaaaa", "</invoke>"),
    ("<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:end|>"),
    ("<|tool_call>call:f{", "a:", "}<tool_call|>"),
    ("<|tool_call>call:f{x:", '<|"|>', "}<tool_call|>"),
    ("<|tool_call>call:f{x:", " ", "1}<tool_call|>"),
    ("<|tool_call_begin|>f<|tool_call_argument_begin|>", "{", "<|tool_call_end|>"),
    ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json", "`", "<｜tool▁call▁end｜>"),
    ("to=functions.f<|message|>", "<|channel|>", "<|call|>"),
    ("<tool_call>", '{"name": "f"}\n', "</tool_call>"),
    ("<tool_call>", "{\n", "</tool_call>"),
    ("[TOOL_CALLS]", "f[CALL_ID]", "[ARGS]{}"),
    ("<|python_tag|>{", '"a": ";', "}"),
)

# A long list of calls in one message, closed.
CALL_LISTS = (
    ("[", "f(x=1), ", "f(x=1)]"),
    ("<|tool_call_start|>[", "f(x=1), ", "f(x=1)]<|tool_call_end|>"),
    ("[TOOL_CALLS][", '{"name": "f", "arguments": {}}, ', '{"name": "f", "arguments": {}}]'),
    ("<tool_call>[", '{"name": "f", "arguments": {}}, ', '{"name": "f", "arguments": {}}]'),
    ("<|tools_prefix|>[", '{"f": {}}, ', '{"f": {}}]<|tools_suffix|>'),
    ("<|tool_call>call:f{x:[", "1,", "1]}<tool_call|>"),
    ("[f(x=[", "1, ", "1])]"),
    ("[f(x={", "'a': 1, ", "})]"),
    ("<tool_call>[", '{"name": "f", "arguments": {}}\n, ', '{"name": "f", "arguments": {}}]'),
    ('<tool_call>{"name": "f", "arguments": {"x": [', "1, ", "1]}}</tool_call>"),
    ("<function=f><parameter=x>", "1, ", "</parameter></function>"),
)


def _grow(unit: str, size: int, prefix: str = "", suffix: str = "") -> str:
    return prefix + unit * max(1, (size - len(prefix) - len(suffix)) // len(unit)) + suffix


def _builders() -> dict[str, Callable[[int], str]]:
    found: dict[str, Callable[[int], str]] = {}
    for unit in (*MARKERS, *UNITS):
        found[f"repeat {unit!r}"] = functools.partial(_grow, unit)
    for prefix, unit in NESTING:
        found[f"nest {prefix!r}+{unit!r}"] = lambda size, p=prefix, u=unit: _grow(u, size, p)
    for prefix, unit, suffix in CLOSED:
        found[f"closed {prefix!r}+{unit!r}"] = lambda size, p=prefix, u=unit, s=suffix: _grow(
            u, size, p, s
        )
    for prefix, unit, suffix in CALL_LISTS:
        found[f"list {prefix!r}+{unit!r}"] = lambda size, p=prefix, u=unit, s=suffix: _grow(
            u, size, p, s
        )
    for name, fmt in FORMATS.items():
        example, cut = fmt.example, fmt.example[: max(1, len(fmt.example) - 3)]
        found[f"{name} example repeated"] = functools.partial(_grow, example)
        found[f"{name} example cut, repeated"] = functools.partial(_grow, cut)
        found[f"{name} example in a long text"] = lambda size, e=example: (
            _grow("a", size // 2) + e + _grow("b", size // 2)
        )
    found["one long word"] = functools.partial(_grow, "a")
    found["newlines"] = functools.partial(_grow, "\n")
    return found


HOSTILE: dict[str, Callable[[int], str]] = _builders()
"""Label -> `build(size)`: a hostile text of about `size` characters."""


def hostile_texts(size: int = 1 << 20) -> dict[str, str]:
    """Label -> a hostile text of about `size` characters."""
    return {label: build(size) for label, build in HOSTILE.items()}
