"""Formats that write each call as a `{"name": ..., "arguments"|"parameters": {...}}` object
with no format markers of their own around it, or only an opening one: xLAM's bare JSON list,
Llama 4's back-to-back objects, phi-4-mini's `functools[...]`, InternLM2's
`<|action_start|><|plugin|>` blocks and Granite-20B-FC's `<function_call>` prefix.

Several of these families' templates write the arguments with Jinja's `str()` of a dict
(`{'city': 'Paris'}`), so an object that is not JSON is read as a Python literal too. Objects are
found by one forward scan that tracks strings and brackets: linear in the text.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any

from toolgym.agents.parsers.base import (
    DECODE_ERRORS,
    AnyCall,
    ParsedMessage,
    Parser,
    before,
    blocks,
    capped,
    decode_json,
    dict_call,
    json_arguments_call,
)
from toolgym.envs.calls import MalformedToolCall

_SEPARATORS = " \t\r\n,;"
_PHI4 = "functools["


def object_spans(text: str, start: int = 0) -> tuple[list[tuple[int, int, bool]], int]:
    """The top-level `{...}` objects from `start`, separated by whitespace, commas or
    semicolons: `(begin, end, closed)` for each, and where the scan stopped (at the first
    character that is neither a separator nor an object). One pass over the text."""
    spans: list[tuple[int, int, bool]] = []
    i, size = start, len(text)
    while True:
        while i < size and text[i] in _SEPARATORS:
            i += 1
        if i >= size or text[i] != "{":
            return spans, i
        end = _object_end(text, i)
        spans.append((i, end if end >= 0 else size, end >= 0))
        if end < 0:
            return spans, size
        i = end


def _object_end(text: str, i: int) -> int:
    """The position after the bracket that closes the one at `i`, or -1 (strings in either
    quote, with backslash escapes, are skipped)."""
    depth, quote, escaped = 0, "", False
    for position in range(i, len(text)):
        char = text[position]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return position + 1
    return -1


def lenient_object(text: str) -> tuple[Any, str | None]:
    """A JSON object, or the same written as a Python literal (`str()` of a dict): `(value,
    None)` or `(None, why not)`; never raises."""
    decoded, error = decode_json(text)
    if error is None:
        return decoded, None
    try:
        value = ast.literal_eval(text)
        value = json.loads(json.dumps(value))  # JSON-like values only; keys become strings
    except (SyntaxError, TypeError, *DECODE_ERRORS):
        return None, error
    return value, None


def _object_call(text: str, closed: bool = True) -> AnyCall:
    if not closed:
        return MalformedToolCall(text, "the call is cut off before its closing brace")
    value, error = lenient_object(text)
    if error is not None:
        return MalformedToolCall(text, error)
    return dict_call(value, text)


def _calls_in(body: str) -> Iterator[AnyCall]:
    """The calls of one body: objects, optionally inside one `[...]` list; text left after
    them is one malformed call."""
    start = len(body) - len(body.lstrip())
    listed = body.startswith("[", start)
    spans, stop = object_spans(body, start + 1 if listed else start)
    for begin, end, closed in spans:
        yield _object_call(body[begin:end], closed)
    rest = body[stop:].strip()
    if listed and rest.startswith("]"):
        rest = rest[1:].strip()
    if not spans:
        yield MalformedToolCall(body, 'expected {"name": ..., "arguments": {...}}')
    elif rest:
        yield MalformedToolCall(rest, "text after the tool calls")


def parse_json_calls(text: str) -> ParsedMessage:
    """A message that is JSON calls: a list (`[{...}, {...}]`, xLAM), objects back to back or
    separated by commas (Llama 4), or either after phi-4-mini's `functools` marker (text
    before the marker is content). Text that is not calls is content: without the marker, a
    message of braces none of which reads as a call is prose."""
    if _PHI4 in text:
        content, _, rest = text.partition(_PHI4)
        body = "[" + rest
        return ParsedMessage(content.strip(), capped(_calls_in(body), body))
    body = text.strip()
    if not body.startswith("{") and not body.lstrip("[ \t\r\n").startswith("{"):
        return ParsedMessage(body)
    calls = capped(_calls_in(body), body)
    if all(isinstance(call, MalformedToolCall) for call in calls):
        return ParsedMessage(body)
    return ParsedMessage("", calls)


def tagged_objects(start: str, end: str | None) -> Parser:
    """Calls as objects after each `start` (to its `end`, or to the next `start` when the
    format has no closing marker); text before the first is content."""

    def parse(text: str) -> ParsedMessage:
        if start not in text:
            return ParsedMessage(text.strip())
        if end is None:
            bodies: Iterator[tuple[str, bool]] = ((b, True) for b in text.split(start)[1:])
        else:
            bodies = blocks(text, start, end)
        found = (call for body, _closed in bodies for call in _calls_in(body))
        return ParsedMessage(before(text, start), capped(found, text))

    return parse


parse_internlm2 = tagged_objects("<|action_start|><|plugin|>", "<|action_end|>")
parse_internlm2.__doc__ = 'InternLM2: `<|action_start|><|plugin|>{"name": ...}<|action_end|>`.'
parse_granite_20b_fc = tagged_objects("<function_call>", None)
parse_granite_20b_fc.__doc__ = 'Granite-20B-FC: `<function_call> {"name": ...}` per call.'


_RECIPIENT = re.compile(r"[A-Za-z_][\w.\-]*")


def parse_functionary_v32(text: str) -> ParsedMessage:
    """Functionary v3.2: each turn part is `RECIPIENT\n...` after `>>>` (the generation prompt
    writes the first `>>>`); a tool's name takes `{json}` arguments, `all` is text for the
    user. A part that is neither is content."""
    content: list[str] = []

    def calls() -> Iterator[AnyCall]:
        for part in text.strip().removeprefix(">>>").split(">>>"):
            recipient, newline, body = part.partition("\n")
            recipient = recipient.strip()
            if newline and recipient == "all":
                content.append(body.strip())
            elif newline and _RECIPIENT.fullmatch(recipient) and body.lstrip().startswith("{"):
                yield json_arguments_call(recipient, body, part, True)
            else:
                content.append(part.strip())

    found = capped(calls(), text)
    return ParsedMessage("\n".join(c for c in content if c), found)
