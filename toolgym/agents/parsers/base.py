"""What every parser returns, and the small pieces the formats share.

A parser never raises on what a model wrote: text that is meant as a tool call but cannot be
read becomes a `MalformedToolCall`, which the environment answers with an explanation and
counts as a failure. Formats that write argument values as bare text (XML, pythonic, Gemma)
keep them as strings; `type_arguments` gives them the types the tool's schema declares.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolgym.envs.core import MalformedToolCall, ToolCall, tool_call_from_dict

AnyCall = ToolCall | MalformedToolCall


@dataclass
class ParsedMessage:
    """An assistant message split into its reasoning, its text and its tool calls."""

    content: str
    tool_calls: list[AnyCall] = field(default_factory=list)
    reasoning: str = ""

    @property
    def failures(self) -> int:
        return sum(isinstance(call, MalformedToolCall) for call in self.tool_calls)


Parser = Callable[[str], ParsedMessage]


def first_of(*parsers: Parser) -> Parser:
    """A parser for a format written in several ways: the first reading that finds calls."""

    def parse(text: str) -> ParsedMessage:
        readings = [parser(text) for parser in parsers]
        return next((r for r in readings if r.tool_calls), readings[0])

    return parse


def json_call(text: str, name_keys: tuple[str, ...] = ("name",)) -> AnyCall:
    """A JSON object naming a tool and its arguments -> a call, or why not."""
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError as error:
        return MalformedToolCall(text, f"invalid JSON ({error.msg} at position {error.pos})")
    return dict_call(decoded, text, name_keys)


def dict_call(data: Any, text: str, name_keys: tuple[str, ...] = ("name",)) -> AnyCall:
    """`{"name": ..., "arguments"|"parameters": ...}` (or another name key) -> a call."""
    if isinstance(data, dict):
        for key in name_keys:
            if isinstance(data.get(key), str) and key != "name":
                data = {"name": data[key], "arguments": data.get("parameters", {})}
                break
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
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError as error:
        return MalformedToolCall(text, f"invalid JSON arguments ({error.msg})")
    if not isinstance(decoded, dict):
        return MalformedToolCall(text, "the arguments must be a JSON object")
    return ToolCall(name, decoded)


def json_or_text(value: str) -> Any:
    """JSON values (numbers, lists, objects, booleans) decoded; anything else kept as text."""
    try:
        return json.loads(value)
    except (json.JSONDecodeError, ValueError):
        return value


def blocks(text: str, start: str, end: str) -> list[tuple[str, bool]]:
    """The text between each `start` and its `end`, and whether the end was there (a block
    cut by the token limit runs to the end of the text)."""
    found, position = [], 0
    while (opening := text.find(start, position)) >= 0:
        body_start = opening + len(start)
        closing = text.find(end, body_start)
        if closing < 0:
            found.append((text[body_start:], False))
            break
        found.append((text[body_start:closing], True))
        position = closing + len(end)
    return found


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


_SCHEMA_TYPES_KEPT_AS_TEXT = {"string"}


def type_arguments(parsed: ParsedMessage, tools: list[dict] | None) -> ParsedMessage:
    """Decode text argument values the tool's schema types otherwise (`"2"` -> 2 where the
    schema says integer, `"[1, 2]"` -> a list where it says array). Values that do not decode
    stay as written, for the tool's argument check to report."""
    if not tools:
        return parsed
    schemas = {
        tool["function"]["name"]: tool["function"].get("parameters", {}).get("properties", {})
        for tool in tools
        if "function" in tool
    }
    for call in parsed.tool_calls:
        if isinstance(call, ToolCall) and isinstance(call.arguments, dict):
            properties = schemas.get(call.name, {})
            call.arguments = {
                key: _typed(value, properties.get(key)) for key, value in call.arguments.items()
            }
    return parsed


def _typed(value: Any, schema: dict | None) -> Any:
    if not isinstance(value, str) or schema is None:
        return value
    declared = _declared_types(schema)
    if not declared or declared & _SCHEMA_TYPES_KEPT_AS_TEXT:
        return value
    text = value.strip()
    if "boolean" in declared and text in ("True", "False"):
        return text == "True"
    decoded = json_or_text(text)
    return value if isinstance(decoded, str) else decoded


def _declared_types(schema: dict) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    types: set[str] = set()
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        if isinstance(option, dict):
            types |= _declared_types(option)
    return types


_THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>", re.DOTALL)


def split_reasoning(text: str) -> tuple[str, str]:
    """`(reasoning, rest)`: a leading `<think>...</think>` block (the opening tag may be in the
    prompt) separated from what follows; `("", text)` when there is none."""
    match = _THINK.match(text)
    if match is None:
        return "", text
    return match.group(1).strip(), text[match.end() :]
