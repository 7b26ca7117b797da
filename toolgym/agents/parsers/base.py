"""What every parser returns, and the small pieces the formats share.

A parser never raises on what a model wrote: text that is meant as a tool call but cannot be
read becomes a `MalformedToolCall`, which the environment answers with an explanation and
counts as a failure. Formats that write argument values as bare text (XML, pythonic, Gemma)
keep them as strings; `type_arguments` gives them the types the tool's schema declares.

A parser's time is linear in the text, whatever the text: scans move forward (`Scan`), never
re-search the rest of the text from each failed candidate, and a message reads at most
`MAX_CALLS` calls (`capped`: the rest become one malformed call saying so).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from toolgym.envs.calls import MalformedToolCall, ToolCall, tool_call_from_dict

AnyCall = ToolCall | MalformedToolCall


@dataclass
class ParsedMessage:
    """An assistant message split into its reasoning, its text and its tool calls."""

    content: str
    tool_calls: list[AnyCall] = field(default_factory=list)
    reasoning: str = ""

    @property
    def failures(self) -> int:
        """How many of the calls are malformed."""
        return sum(isinstance(call, MalformedToolCall) for call in self.tool_calls)


Parser = Callable[[str], ParsedMessage]


MAX_CALLS = 1000
"""The most tool calls a parser reads from one message; past it, one malformed call says so."""


def capped(calls: Iterable[AnyCall], text: str = "") -> list[AnyCall]:
    """The first `MAX_CALLS` of `calls` (read lazily), and a malformed call naming the cap where
    the message holds more."""
    found: list[AnyCall] = []
    for call in calls:
        if len(found) == MAX_CALLS:
            found.append(MalformedToolCall(text[:200], too_many_calls()))
            break
        found.append(call)
    return found


def too_many_calls() -> str:
    """The error of the malformed call that stands for the calls past `MAX_CALLS`."""
    return f"more than {MAX_CALLS} tool calls in one message: the rest were not read"


class Scan:
    """Finds strings and patterns in one text from positions that only move forward, as a
    parser reads left to right: each one's next match is kept until the reading passes it. A
    search from each candidate start instead (`str.find` or a regex's `finditer` that fails
    on a marker with no close) re-reads the rest of the text per candidate: quadratic time on
    a marker repeated with no close."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._found: dict[str | re.Pattern[str], tuple[int, re.Match[str] | int | None]] = {}

    def find(self, needle: str, start: int) -> int:
        """`text.find(needle, start)`."""
        found = self._cached(needle, start)
        if found is False:
            found = self.text.find(needle, start)
            self._found[needle] = (start, found if found >= 0 else None)
        return -1 if found is None else found  # type: ignore[return-value]

    def search(self, pattern: re.Pattern[str], start: int) -> re.Match[str] | None:
        """`pattern.search(text, start)` (for patterns without anchors or lookbehind)."""
        found = self._cached(pattern, start)
        if found is False:
            found = pattern.search(self.text, start)
            self._found[pattern] = (start, found)
        return found  # type: ignore[return-value]

    def _cached(self, key: str | re.Pattern[str], start: int) -> re.Match[str] | int | bool | None:
        """The kept result where it still answers a search from `start`; False otherwise."""
        if key not in self._found:
            return False
        origin, found = self._found[key]
        if origin > start:
            return False
        if found is None:
            return None
        position = found if isinstance(found, int) else found.start()
        return found if position >= start else False


def first_of(*parsers: Parser) -> Parser:
    """A parser for a format written in several ways: the first reading that finds calls."""

    def parse(text: str) -> ParsedMessage:
        readings = [parser(text) for parser in parsers]
        return next((r for r in readings if r.tool_calls), readings[0])

    return parse


# What decoding model text can raise besides a syntax error: nesting deeper than the
# interpreter's recursion limit, integers longer than Python's digit limit, memory.
DECODE_ERRORS = (ValueError, RecursionError, MemoryError)


def decode_json(text: str) -> tuple[Any, str | None]:
    """`(value, None)`, or `(None, why not)` for text that is not JSON (never raises; NaN and
    Infinity are not JSON)."""
    try:
        return json.loads(text, parse_constant=_reject_constant), None
    except json.JSONDecodeError as error:
        return None, f"invalid JSON ({error.msg} at position {error.pos})"
    except DECODE_ERRORS as error:
        return None, f"unreadable JSON ({type(error).__name__})"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_call(text: str, name_keys: tuple[str, ...] = ("name",)) -> AnyCall:
    """A JSON object naming a tool and its arguments -> a call, or why not."""
    decoded, error = decode_json(text)
    if error is not None:
        return MalformedToolCall(text, error)
    return dict_call(decoded, text, name_keys)


def dict_call(data: Any, text: str, name_keys: tuple[str, ...] = ("name",)) -> AnyCall:
    """`{"name": ..., "arguments"|"parameters": ...}` (or another name key) -> a call."""
    if isinstance(data, dict):
        for key in name_keys:
            if isinstance(data.get(key), str) and key != "name":
                data = {"name": data[key], "arguments": data.get("parameters", {})}
                break
        data = {k: v for k, v in data.items() if k != "id"}  # ids are toolgym's to give
    return tool_call_from_dict(data, text)


def json_arguments_call(name: str, arguments: str, text: str, closed: bool = False) -> AnyCall:
    """A tool name written apart from its JSON arguments -> a call, or why not. Arguments left
    out count as `{}` only in a call whose closing marker is there (not one cut off)."""
    name = name.strip()
    if not name:
        return MalformedToolCall(text, "the tool call has no function name")
    arguments = arguments.strip()
    if not arguments:
        if not closed:
            return MalformedToolCall(text, "the call ends before its arguments (write {} for none)")
        arguments = "{}"
    decoded, error = decode_json(arguments)
    if error is not None:
        return MalformedToolCall(text, f"{error} in the arguments")
    if not isinstance(decoded, dict):
        return MalformedToolCall(text, "the arguments must be a JSON object")
    return ToolCall(name, decoded)


def json_or_text(value: str) -> Any:
    """JSON values (numbers, lists, objects, booleans) decoded; anything else kept as text."""
    decoded, error = decode_json(value)
    return value if error is not None else decoded


def blocks(text: str, start: str, end: str) -> Iterator[tuple[str, bool]]:
    """The text between each `start` and its `end`, and whether the end was there (a block
    cut by the token limit runs to the end of the text)."""
    position = 0
    while (opening := text.find(start, position)) >= 0:
        body_start = opening + len(start)
        closing = text.find(end, body_start)
        if closing < 0:
            yield text[body_start:], False
            return
        yield text[body_start:closing], True
        position = closing + len(end)


def before(text: str, marker: str) -> str:
    """The text before the first `marker` (all of it if there is none), stripped."""
    return text.split(marker, 1)[0].strip()


def split_top_level(text: str, separator: str) -> list[str]:
    """Split on `separator` outside JSON strings and brackets."""
    parts, depth, start, in_string, escaped = [], 0, 0, False, False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def type_arguments(parsed: ParsedMessage, tools: list[dict] | None) -> ParsedMessage:
    """Decode text argument values the tool's schema types otherwise (`"2"` -> 2 where the
    schema says integer, `"[1, 2]"` -> a list where it says array). Values that do not decode,
    and schemas it cannot read, leave the value as written, for the tool's argument check to
    report."""
    if not tools:
        return parsed
    schemas = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        if isinstance(function, dict) and isinstance(properties, dict):
            schemas[function.get("name")] = properties
    for call in parsed.tool_calls:
        if isinstance(call, ToolCall) and isinstance(call.arguments, dict):
            properties = schemas.get(call.name, {})
            call.arguments = {
                key: _typed(value, properties.get(key)) for key, value in call.arguments.items()
            }
    return parsed


def _typed(value: Any, schema: Any) -> Any:
    if not isinstance(value, str) or not isinstance(schema, dict):
        return value
    declared = _declared_types(schema)
    if not declared or "string" in declared:
        return value
    text = value.strip()
    if "boolean" in declared and text in ("True", "False"):
        return text == "True"
    decoded = json_or_text(text)
    return value if isinstance(decoded, str) else decoded


def _declared_types(schema: dict, depth: int = 0) -> set[str]:
    """The JSON types a schema admits: `type`, its `anyOf`/`oneOf` options, or its enum's."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    types: set[str] = set()
    enum = schema.get("enum")
    if isinstance(enum, list):
        names = {str: "string", bool: "boolean", int: "integer", float: "number"}
        types |= {names.get(type(v), "object") for v in enum}
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and depth < 8:
            for option in options:
                if isinstance(option, dict):
                    types |= _declared_types(option, depth + 1)
    return types


# Where a tool call starts, in the formats that may follow a reasoning block: a `</think>`
# after one of these is inside the call (an argument's text), not the end of reasoning.
_CALL_STARTS = (
    "<tool_call",
    "<function",
    "<invoke",
    "[TOOL_CALLS]",
    "<|tool_call",
    "<｜tool▁call",
    "<|START_ACTION|>",
    "<TOOLCALL>",
    "<tool_calls>",
    "<seed:tool_call>",
    "<minimax:tool_call>",
)


def split_reasoning(text: str) -> tuple[str, str]:
    """`(reasoning, rest)`: a leading `<think>...</think>` block separated from what follows.
    Where the opening tag was in the prompt, the text up to the first `</think>` is reasoning
    unless a tool call started before it (then that `</think>` is inside the call)."""
    end = text.find("</think>")
    if end < 0:
        return "", text
    before = text[:end].lstrip()
    if before.startswith("<think>"):  # the model opened the block itself
        before = before[len("<think>") :]
    elif "<think>" in before or any(marker in before for marker in _CALL_STARTS):
        return "", text  # not a leading block: text or a call came first
    return before.strip(), text[end + len("</think>") :]
