"""Formats that write each argument as its own XML-like element; values are text, typed later
by the tool's schema (`type_arguments`). A block cut off before its closing tag (the token
limit) is a malformed call: its last value may be incomplete."""

from __future__ import annotations

import re

from toolgym.agents.parsers.base import AnyCall, ParsedMessage, before, json_or_text
from toolgym.envs.calls import MalformedToolCall, ToolCall

_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_XML_WRAPPERS = ("<tool_call>", "<seed:tool_call>")


def parse_xml_function(text: str) -> ParsedMessage:
    """`<function=NAME><parameter=KEY>value</parameter></function>`, in any wrapper (Qwen3-Coder,
    Qwen3.5, Nemotron 3, Seed-OSS, StepFun)."""
    calls: list[AnyCall] = []
    for match in _FUNCTION.finditer(text):
        name, body, closing = match.groups()
        if not closing:
            calls.append(MalformedToolCall(match.group(0), "cut off before </function>"))
        elif not name.strip():
            calls.append(MalformedToolCall(match.group(0), "<function=...> needs a name"))
        else:
            arguments = {
                key.strip(): _strip_newlines(value) for key, value in _PARAMETER.findall(body)
            }
            calls.append(ToolCall(name.strip(), arguments))
    if not calls:
        return ParsedMessage(text.strip())
    start = min((text.find(w) for w in (*_XML_WRAPPERS, "<function=") if w in text), default=0)
    return ParsedMessage(text[:start].strip(), calls)


_GLM_CALL = re.compile(r"<tool_call(:\w+|)>(.*?)(</tool_call\1>|\Z)", re.DOTALL)
_GLM_ARGUMENT = re.compile(
    r"<arg_key(?::\w+)?>(.*?)</arg_key(?::\w+)?>\s*<arg_value(?::\w+)?>(.*?)(?:</arg_value(?::\w+)?>|\Z)",
    re.DOTALL,
)
_GLM_NAME_END = re.compile(r"<tool_sep(?::\w+)?>|<arg_key|\n|\Z")


def parse_glm(text: str) -> ParsedMessage:
    """GLM-4.5/4.6/4.7 (and Laguna, Ling, Hunyuan's `:opensource` tags): `<tool_call>NAME
    <arg_key>KEY</arg_key><arg_value>value</arg_value></tool_call>`."""
    calls: list[AnyCall] = []
    for match in _GLM_CALL.finditer(text):
        _, body, closing = match.groups()
        name = body[: _GLM_NAME_END.search(body).start()].strip()
        if not closing:
            calls.append(MalformedToolCall(match.group(0), "cut off before </tool_call>"))
        elif not name or name.startswith(("{", "<")):
            calls.append(
                MalformedToolCall(match.group(0), "expected the tool name after <tool_call>")
            )
        else:
            arguments = {key.strip(): value for key, value in _GLM_ARGUMENT.findall(body)}
            calls.append(ToolCall(name, arguments))
    if not calls:
        return ParsedMessage(text.strip())
    start = re.search(r"<tool_calls?(:\w+)?>", text)
    return ParsedMessage(text[: start.start()].strip() if start else "", calls)


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
    calls: list[AnyCall] = []
    for match in _INVOKE.finditer(text):
        name, body, closing = match.groups()
        if not closing:
            calls.append(MalformedToolCall(match.group(0), "cut off before the closing tag"))
        elif not name.strip():
            calls.append(MalformedToolCall(match.group(0), "the call needs a name"))
        else:
            arguments = {
                key: json_or_text(value) if string == "false" else _strip_newlines(value)
                for key, string, value in _INVOKE_PARAMETER.findall(body)
            }
            calls.append(ToolCall(name.strip(), arguments))
    if not calls:
        return ParsedMessage(text.strip())
    start = _INVOKE_WRAPPER.search(text)
    return ParsedMessage(text[: start.start()].strip() if start else before(text, "<"), calls)


def _strip_newlines(value: str) -> str:
    """Templates put values on their own lines; the value is what lies between."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
