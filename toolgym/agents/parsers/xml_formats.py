"""Formats that write each argument as its own XML-like element; values are text, typed later
by the tool's schema (`type_arguments`). A block cut off before its closing tag (the token
limit) is a malformed call: its last value may be incomplete."""

from __future__ import annotations

import re
from collections.abc import Iterator

from toolgym.agents.parsers.base import (
    AnyCall,
    ParsedMessage,
    Scan,
    before,
    capped,
    json_or_text,
)
from toolgym.envs.calls import MalformedToolCall, ToolCall

_XML_WRAPPERS = ("<tool_call>", "<seed:tool_call>")


def function_blocks(text: str) -> Iterator[tuple[str, str, bool, str]]:
    """Each `<function=NAME>body</function>` (the body runs to the end of the text where the
    closing tag is missing): `(name, body, closed, the whole block)`; a name ends at the
    first `>` and holds no newline. One forward scan: a regex that fails on a `<function=`
    with no `>` re-reads the rest of the text from each such candidate."""
    scan, position = Scan(text), 0
    while (opening := scan.find("<function=", position)) >= 0:
        name_start = opening + len("<function=")
        name_end, newline = scan.find(">", name_start), scan.find("\n", name_start)
        if name_end < 0:
            return  # no later candidate closes its name either
        if 0 <= newline < name_end:
            position = opening + 1
            continue
        closing = scan.find("</function>", name_end + 1)
        body_end = closing if closing >= 0 else len(text)
        end = closing + len("</function>") if closing >= 0 else len(text)
        name, body = text[name_start:name_end], text[name_end + 1 : body_end]
        yield name, body, closing >= 0, text[opening:end]
        position = end


def _parameters(body: str) -> Iterator[tuple[str, str]]:
    """`(key, value)` for each `<parameter=KEY>value</parameter>`, a value ending at its closing
    tag, the next `<parameter=` or the end of the body, in one forward scan."""
    scan, position = Scan(body), 0
    while (opening := scan.find("<parameter=", position)) >= 0:
        key_start = opening + len("<parameter=")
        key_end, newline = scan.find(">", key_start), scan.find("\n", key_start)
        if key_end < 0:
            return
        if 0 <= newline < key_end:
            position = opening + 1
            continue
        closing = scan.find("</parameter>", key_end + 1)
        following = scan.find("<parameter=", key_end + 1)
        ends = [i for i in (closing, following) if i >= 0]
        value_end = min(ends) if ends else len(body)
        yield body[key_start:key_end], body[key_end + 1 : value_end]
        position = value_end + len("</parameter>") if value_end == closing else value_end


def parse_xml_function(text: str) -> ParsedMessage:
    """`<function=NAME><parameter=KEY>value</parameter></function>`, in any wrapper (Qwen3-Coder,
    Qwen3.5, Nemotron 3, Seed-OSS, StepFun)."""
    calls = capped(_xml_function_calls(text), text)
    if not calls:
        return ParsedMessage(text.strip())
    start = min((text.find(w) for w in (*_XML_WRAPPERS, "<function=") if w in text), default=0)
    return ParsedMessage(text[:start].strip(), calls)


def _xml_function_calls(text: str) -> Iterator[AnyCall]:
    for name, body, closed, whole in function_blocks(text):
        if not closed:
            yield MalformedToolCall(whole, "cut off before </function>")
        elif not name.strip():
            yield MalformedToolCall(whole, "<function=...> needs a name")
        else:
            arguments = {key.strip(): _strip_newlines(value) for key, value in _parameters(body)}
            yield ToolCall(name.strip(), arguments)


_GLM_CALL = re.compile(r"<tool_call(:\w+|)>(.*?)(</tool_call\1>|\Z)", re.DOTALL)
_GLM_KEY = re.compile(r"<arg_key(?::\w+)?>")
_GLM_KEY_END = re.compile(r"</arg_key(?::\w+)?>\s*<arg_value(?::\w+)?>")
_GLM_VALUE_END = re.compile(r"</arg_value(?::\w+)?>")
_GLM_NAME_END = re.compile(r"<tool_sep(?::\w+)?>|<arg_key|\n|\Z")


def parse_glm(text: str) -> ParsedMessage:
    """GLM-4.5/4.6/4.7 (and Laguna, Ling, Hunyuan's `:opensource` tags): `<tool_call>NAME
    <arg_key>KEY</arg_key><arg_value>value</arg_value></tool_call>`."""
    calls = capped(_glm_calls(text), text)
    if not calls:
        return ParsedMessage(text.strip())
    start = re.search(r"<tool_calls?(:\w+)?>", text)
    return ParsedMessage(text[: start.start()].strip() if start else "", calls)


def _glm_calls(text: str) -> Iterator[AnyCall]:
    for match in _GLM_CALL.finditer(text):
        _, body, closing = match.groups()
        end = _GLM_NAME_END.search(body)  # matches at the latest at the end (\Z)
        name = body[: end.start() if end else len(body)].strip()
        if not closing:
            yield MalformedToolCall(match.group(0), "cut off before </tool_call>")
        elif not name or name.startswith(("{", "<")):
            yield MalformedToolCall(match.group(0), "expected the tool name after <tool_call>")
        else:
            yield ToolCall(name, {key.strip(): value for key, value in _glm_arguments(body)})


def _glm_arguments(body: str) -> Iterator[tuple[str, str]]:
    """`(key, value)` for each `<arg_key>KEY</arg_key><arg_value>value</arg_value>` (a key runs
    to the first `</arg_key>` that an `<arg_value>` follows; a value to its closing tag or the
    end), in one forward scan (a regex re-reads the rest of the body from each `<arg_key>`
    whose key is never followed by a value)."""
    scan, position = Scan(body), 0
    while (key := scan.search(_GLM_KEY, position)) is not None:
        key_end = scan.search(_GLM_KEY_END, key.end())
        if key_end is None:
            return  # no later key is followed by a value either
        value_end = scan.search(_GLM_VALUE_END, key_end.end())
        stop = value_end.start() if value_end is not None else len(body)
        yield body[key.end() : key_end.start()], body[key_end.end() : stop]
        position = value_end.end() if value_end is not None else len(body)


_PREFIX = r"(?:[\w-]+:|｜DSML｜)?"
_INVOKE = re.compile(
    rf"<{_PREFIX}(?:invoke|function) name=\"([^\"]*)\"\s*>(.*?)"
    rf"(</{_PREFIX}(?:invoke|function)>|\Z)",
    re.DOTALL,
)
_INVOKE_PARAMETER = re.compile(
    rf"<{_PREFIX}(?:parameter|param) name=\"([^\"]*)\"(?:\s+string=\"(true|false)\")?\s*>(.*?)"
    rf"(?:</{_PREFIX}(?:parameter|param)>|\Z)",
    re.DOTALL,
)
_INVOKE_WRAPPER = re.compile(
    rf"<{_PREFIX}(?:function_calls|tool_calls|tool_call)>|<{_PREFIX}invoke |<function name="
)


def parse_invoke(text: str) -> ParsedMessage:
    """`<invoke name="NAME"><parameter name="KEY">value</parameter></invoke>` with or without a
    tag prefix (MiniMax-M2, DeepSeek V3.2/V4 DSML, Muse `atem:`), and MiniCPM's `<function
    name=...><param name=...>`. DSML's `string="false"` values are JSON."""
    calls = capped(_invoke_calls(text), text)
    if not calls:
        return ParsedMessage(text.strip())
    start = _INVOKE_WRAPPER.search(text)
    return ParsedMessage(text[: start.start()].strip() if start else before(text, "<"), calls)


def _invoke_calls(text: str) -> Iterator[AnyCall]:
    for match in _INVOKE.finditer(text):
        name, body, closing = match.groups()
        if not closing:
            yield MalformedToolCall(match.group(0), "cut off before the closing tag")
        elif not name.strip():
            yield MalformedToolCall(match.group(0), "the call needs a name")
        else:
            arguments = {
                key: json_or_text(value) if string == "false" else _strip_newlines(value)
                for key, string, value in _INVOKE_PARAMETER.findall(body)
            }
            yield ToolCall(name.strip(), arguments)


def _strip_newlines(value: str) -> str:
    """Templates put values on their own lines; the value is what lies between."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
