"""Formats whose arguments are a JSON object: tagged JSON blocks, bare JSON, and formats that
write the tool's name between marker tokens before its JSON arguments."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from toolgym.agents.parsers.base import (
    MAX_CALLS,
    AnyCall,
    ParsedMessage,
    Parser,
    Scan,
    before,
    blocks,
    capped,
    decode_json,
    dict_call,
    json_arguments_call,
    json_call,
    split_top_level,
    too_many_calls,
)
from toolgym.agents.parsers.xml_formats import function_blocks
from toolgym.envs.calls import MalformedToolCall, ToolCall


def tagged_json(start: str, end: str | None, name_keys: tuple[str, ...] = ("name",)) -> Parser:
    """Calls written as JSON between `start` and `end` (`None`: to the end of the message): one
    object, a list of objects, or one object per line. Text before the first block is content.
    """

    def parse(text: str) -> ParsedMessage:
        if start not in text:
            return ParsedMessage(text.strip())
        bodies = blocks(text, start, end or "\0")
        found = (call for body, _ in bodies for call in _json_calls(body.strip(), name_keys))
        calls = capped(found, text)
        return ParsedMessage(before(text, start), calls)

    return parse


def _json_calls(body: str, name_keys: tuple[str, ...]) -> Iterator[AnyCall]:
    """The calls in one block, read lazily (the caller stops at `MAX_CALLS`)."""
    decoded, error = decode_json(body)
    if error is not None:
        lines = [line for line in body.splitlines() if line.strip()]
        if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines):
            return (json_call(line.strip(), name_keys) for line in lines)
        return iter([MalformedToolCall(body, error)])
    items = decoded if isinstance(decoded, list) else [decoded]
    if not items:
        return iter([MalformedToolCall(body, "an empty list of tool calls")])
    return (dict_call(item, json.dumps(item), name_keys) for item in items)


parse_hermes = tagged_json("<tool_call>", "</tool_call>")
parse_hermes.__doc__ = "`<tool_call>{json}</tool_call>` blocks (Hermes, Qwen2.5, Qwen3, Granite 4)."


def parse_llama3(text: str) -> ParsedMessage:
    """A message that is one or more JSON calls (`;`-separated), maybe after `<|python_tag|>`."""
    body = text.strip()
    tagged = body.startswith("<|python_tag|>")
    body = body.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedMessage(text.strip())
    pieces = [p.strip() for p in split_top_level(body, ";") if p.strip()]
    calls = capped((json_call(piece) for piece in pieces), body)
    if not tagged and all(isinstance(c, MalformedToolCall) for c in calls):
        return ParsedMessage(text.strip())  # prose in braces, not an attempted call
    return ParsedMessage("", calls)


_MISTRAL = "[TOOL_CALLS]"


def parse_mistral(text: str) -> ParsedMessage:
    """`[TOOL_CALLS]` then a JSON list, or `name[ARGS]{json}` (with `[CALL_ID]id` optional)."""
    if _MISTRAL not in text:
        return ParsedMessage(text.strip())
    content, _, rest = text.partition(_MISTRAL)
    rest = rest.strip()
    if rest.startswith("["):
        return ParsedMessage(content.strip(), capped(_json_calls(rest, ("name",)), rest))
    return ParsedMessage(content.strip(), capped(map(_mistral_call, rest.split(_MISTRAL)), rest))


def _mistral_call(chunk: str) -> AnyCall:
    head, marker, arguments = chunk.partition("[ARGS]")
    if not marker:
        return MalformedToolCall(chunk, "expected name[ARGS]{...}")
    return json_arguments_call(head.split("[CALL_ID]", 1)[0], arguments, chunk)


_DEEPSEEK_CALLS = "<｜tool▁calls▁begin｜>"
_DEEPSEEK_CALL = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
_DEEPSEEK_SEP = "<｜tool▁sep｜>"


def marked_calls(
    text: str, section: str, call: tuple[str, str], read: Callable[[str, bool], AnyCall]
) -> ParsedMessage:
    """Calls each between `call` markers, optionally inside a `section` marker; `read(body,
    closed)` reads one. Content is the text before the section (or the first call)."""
    start = section if section in text else call[0]
    if start not in text:
        return ParsedMessage(text.strip())
    calls = capped((read(body, closed) for body, closed in blocks(text, *call)), text)
    if not calls:
        calls.append(MalformedToolCall(text, "a tool-call section without a call"))
    return ParsedMessage(before(text, start), calls)


def parse_deepseek(text: str) -> ParsedMessage:
    """DeepSeek V3 (`function<sep>NAME` then fenced JSON) and V3.1 (`NAME<sep>JSON`)."""
    return marked_calls(text, _DEEPSEEK_CALLS, _DEEPSEEK_CALL, _deepseek_call)


def _deepseek_call(body: str, closed: bool) -> AnyCall:
    first, separator, rest = body.partition(_DEEPSEEK_SEP)
    if not separator:
        return MalformedToolCall(body, f"expected NAME{_DEEPSEEK_SEP}{{arguments}}")
    if first.strip() == "function" and "\n" in rest:  # V3: the name, then fenced JSON
        name, _, arguments = rest.partition("\n")
        return json_arguments_call(name, _unfenced(arguments), body, closed)
    return json_arguments_call(first, rest, body, closed)


def _unfenced(text: str) -> str:
    """The text inside a Markdown code fence (```json ... ```), or the text as it is."""
    body = text.strip()
    if not body.startswith("```"):
        return text
    body = body[3:].removeprefix("json")
    return body[:-3] if body.endswith("```") else body


_KIMI_SECTION = "<|tool_calls_section_begin|>"
_KIMI_CALL = ("<|tool_call_begin|>", "<|tool_call_end|>")
_KIMI_ARGUMENTS = "<|tool_call_argument_begin|>"


def _kimi_name(head: str) -> str:
    """`functions.NAME:0` -> NAME."""
    name = head.strip().removeprefix("functions.")
    stem, colon, index = name.rpartition(":")
    return stem if colon and index.isdigit() else name


def parse_kimi_k2(text: str) -> ParsedMessage:
    """Kimi-K2: `<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{json}`."""
    return marked_calls(text, _KIMI_SECTION, _KIMI_CALL, _kimi_call)


def _kimi_call(body: str, closed: bool) -> AnyCall:
    head, separator, arguments = body.partition(_KIMI_ARGUMENTS)
    if not separator:
        return MalformedToolCall(body, f"expected functions.NAME:0{_KIMI_ARGUMENTS}")
    call = json_arguments_call(_kimi_name(head), arguments, body, closed)
    if isinstance(call, ToolCall):
        call.id = head.strip()  # the template writes it back with the result
    return call


_SOLAR_CALL = ("<|tool_call:begin|>", "<|tool_call:end|>")
_SOLAR_NAME, _SOLAR_ARGUMENTS = "<|tool_call:name|>", "<|tool_call:args|>"


def parse_solar(text: str) -> ParsedMessage:
    """Solar Open: `<|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{json}`."""
    return marked_calls(text, "<|tool_calls|>", _SOLAR_CALL, _solar_call)


def _solar_call(body: str, closed: bool) -> AnyCall:
    name = body.find(_SOLAR_NAME)
    arguments = body.find(_SOLAR_ARGUMENTS, name + len(_SOLAR_NAME)) if name >= 0 else -1
    if arguments < 0:
        return MalformedToolCall(body, f"expected {_SOLAR_NAME}NAME{_SOLAR_ARGUMENTS}")
    name_text = body[name + len(_SOLAR_NAME) : arguments]
    return json_arguments_call(name_text, body[arguments + len(_SOLAR_ARGUMENTS) :], body, closed)


def parse_functionary(text: str) -> ParsedMessage:
    """Functionary v3.1 / Llama 3.1 custom: `<function=NAME>{json}</function>`."""
    found = (
        json_arguments_call(name, arguments, whole, closed)
        for name, arguments, closed, whole in function_blocks(text)
        if not arguments.lstrip().startswith("<parameter")
    )
    calls = capped(found, text)
    return ParsedMessage(before(text, "<function=") if calls else text.strip(), calls)


def parse_apertus(text: str) -> ParsedMessage:
    """Apertus: `<|tools_prefix|>[{"NAME": {arguments}}, ...]<|tools_suffix|>`."""
    start = "<|tools_prefix|>"
    if start not in text:
        return ParsedMessage(text.strip())
    calls = capped(_apertus_calls(text, start), text)
    return ParsedMessage(before(text, start), calls)


def _apertus_calls(text: str, start: str) -> Iterator[AnyCall]:
    for body, _closed in blocks(text, start, "<|tools_suffix|>"):
        items, error = decode_json(body)
        if error is not None:
            yield MalformedToolCall(body, error)
            continue
        for item in items if isinstance(items, list) else [items]:
            if isinstance(item, dict) and len(item) == 1:
                [(name, arguments)] = item.items()
                yield dict_call({"name": name, "arguments": arguments}, json.dumps(item))
            else:
                yield MalformedToolCall(json.dumps(item), 'expected {"NAME": {...}}')


_HARMONY_ENDS = ("<|call|>", "<|end|>", "<|start|>", "<|return|>")


def parse_harmony(text: str) -> ParsedMessage:
    """gpt-oss harmony: `to=functions.NAME ... <|message|>{json}<|call|>`; the analysis channel
    is reasoning, the final channel is content."""
    calls: list[AnyCall] = []
    reasoning, content = [], []
    for header, body, closed in _harmony_messages(text):
        if "to=functions." in header:
            if len(calls) == MAX_CALLS:
                calls.append(MalformedToolCall(text[:200], too_many_calls()))
                break
            words = header.split("to=functions.", 1)[1].split(None, 1)
            name = words[0].split("<|", 1)[0] if words else ""
            calls.append(json_arguments_call(name, body, header + body, closed))
        elif "<|channel|>analysis" in header:
            reasoning.append(body.strip())
        elif "<|channel|>final" in header:
            content.append(body.strip())
    if not calls and not reasoning and not content:
        return ParsedMessage(text.strip())
    return ParsedMessage("\n".join(content), calls, "\n".join(reasoning))


def _harmony_messages(text: str) -> Iterator[tuple[str, str, bool]]:
    """Each `<|message|>` with the header before it (since the previous message ended), its
    body, and whether an end marker closed it (one forward scan: an end marker missing from
    the text is looked for once, not once per message)."""
    scan, position = Scan(text), 0
    while (start := scan.find("<|message|>", position)) >= 0:
        header = text[position:start]
        body_start = start + len("<|message|>")
        ends = [i for i in (scan.find(m, body_start) for m in _HARMONY_ENDS) if i >= 0]
        end = min(ends) if ends else len(text)
        yield header, text[body_start:end], bool(ends)
        position = end
