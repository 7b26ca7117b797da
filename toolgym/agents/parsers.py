"""Tool-call parsers: an assistant's text -> its content and the tool calls in it.

One parser per model family's format. A parser never raises on what a model wrote: text that
is meant as a tool call but cannot be read becomes a `MalformedToolCall`, which the environment
answers with an explanation and counts as a failure.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes, Qwen2.5,
  Qwen3, SmolLM2 with toolgym's template); several per message.
- `llama3`: a JSON object `{"name": ..., "parameters": {...}}` as the whole message, optionally
  after `<|python_tag|>`; several separated by `;`.
- `mistral`: `[TOOL_CALLS][{...}, ...]` or `[TOOL_CALLS]name[ARGS]{...}` (newer tokenizers).
- `qwen3_coder`: `<tool_call><function=name><parameter=p>value</parameter></function></tool_call>`.
- `tokenizer`: the tokenizer's own `response_template` through `tokenizer.parse_response`.

`get_parser("auto", tokenizer)` renders a known tool call with the tokenizer's chat template and
picks the parser that reads it back; any callable `f(text) -> ParsedMessage` can be passed too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolgym.envs.core import (
    MalformedToolCall,
    ToolCall,
    tool_call_from_dict,
    tool_call_from_json,
)

AnyCall = ToolCall | MalformedToolCall


@dataclass
class ParsedMessage:
    """An assistant message split into its text and its tool calls."""

    content: str
    tool_calls: list[AnyCall] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return sum(isinstance(call, MalformedToolCall) for call in self.tool_calls)


Parser = Callable[[str], ParsedMessage]

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_QWEN3_CODER_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
_QWEN3_CODER_PARAMETER = re.compile(
    r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL
)
_MISTRAL_MARK = "[TOOL_CALLS]"


def parse_hermes(text: str) -> ParsedMessage:
    """`<tool_call>` JSON blocks; an unterminated last block (cut by length) is still read."""
    calls = [tool_call_from_json(block.strip()) for block in _HERMES_BLOCK.findall(text)]
    content = text.split("<tool_call>", 1)[0].strip() if calls else text.strip()
    return ParsedMessage(content, calls)


def parse_llama3(text: str) -> ParsedMessage:
    """A message that is one or more JSON calls (`;`-separated), maybe after `<|python_tag|>`."""
    body = text.strip()
    tagged = body.startswith("<|python_tag|>")
    body = body.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedMessage(text.strip())
    pieces = [p.strip() for p in _split_top_level(body, ";") if p.strip()]
    calls = [tool_call_from_json(piece) for piece in pieces]
    if not tagged and all(isinstance(c, MalformedToolCall) for c in calls):
        return ParsedMessage(text.strip())  # prose in braces, not an attempted call
    return ParsedMessage("", calls)


def parse_mistral(text: str) -> ParsedMessage:
    """`[TOOL_CALLS]` followed by a JSON list, or by `name[ARGS]{json}` pairs."""
    if _MISTRAL_MARK not in text:
        return ParsedMessage(text.strip())
    content, _, rest = text.partition(_MISTRAL_MARK)
    rest = rest.strip()
    if rest.startswith("["):
        try:
            decoded = json.loads(rest)
        except json.JSONDecodeError as error:
            return ParsedMessage(
                content.strip(), [MalformedToolCall(rest, f"invalid JSON ({error.msg})")]
            )
        items = decoded if isinstance(decoded, list) else [decoded]
        return ParsedMessage(content.strip(), [tool_call_from_dict(i) for i in items])
    calls: list[AnyCall] = []
    for chunk in rest.split(_MISTRAL_MARK):
        name, marker, arguments = chunk.partition("[ARGS]")
        if not marker or not name.strip():
            calls.append(MalformedToolCall(chunk, "expected name[ARGS]{...}"))
            continue
        calls.append(
            tool_call_from_dict(
                {"name": name.strip(), "arguments": _json_or_text(arguments)}, chunk
            )
        )
    return ParsedMessage(content.strip(), calls)


def parse_qwen3_coder(text: str) -> ParsedMessage:
    """Qwen3-Coder XML: `<function=name>` with one `<parameter=p>` element per argument."""
    blocks = _HERMES_BLOCK.findall(text)
    calls: list[AnyCall] = []
    for block in blocks:
        function = _QWEN3_CODER_FUNCTION.search(block)
        if function is None or not function.group(1).strip():
            calls.append(MalformedToolCall(block, "expected <function=name> inside <tool_call>"))
            continue
        arguments = {
            name.strip(): _json_or_text(value.strip("\n"))
            for name, value in _QWEN3_CODER_PARAMETER.findall(function.group(2))
        }
        calls.append(ToolCall(function.group(1).strip(), arguments))
    content = text.split("<tool_call>", 1)[0].strip() if blocks else text.strip()
    return ParsedMessage(content, calls)


def tokenizer_parser(tokenizer: Any) -> Parser:
    """A parser using the tokenizer's own `response_template` (transformers >= 5)."""
    if getattr(tokenizer, "response_template", None) is None:
        raise ValueError("this tokenizer has no response_template; choose a parser by name")

    def parse(text: str) -> ParsedMessage:
        try:
            message = tokenizer.parse_response(text)
        except Exception as error:  # the template's parser can fail on arbitrary text
            return ParsedMessage(
                text.strip(), [MalformedToolCall(text, f"unreadable response ({error})")]
            )
        calls = [
            tool_call_from_dict(call.get("function", call))
            for call in message.get("tool_calls") or []
        ]
        return ParsedMessage((message.get("content") or "").strip(), calls)

    return parse


PARSERS: dict[str, Parser] = {
    "hermes": parse_hermes,
    "llama3": parse_llama3,
    "mistral": parse_mistral,
    "qwen3_coder": parse_qwen3_coder,
}


def get_parser(parser: str | Parser, tokenizer: Any = None) -> Parser:
    """A parser by name (`PARSERS`, `"tokenizer"`, `"auto"`) or the callable itself."""
    if callable(parser):
        return parser
    if parser == "tokenizer":
        return tokenizer_parser(tokenizer)
    if parser == "auto":
        return detect_parser(tokenizer)
    if parser not in PARSERS:
        raise ValueError(
            f"unknown parser {parser!r}; choose one of {[*PARSERS, 'tokenizer', 'auto']} "
            "or pass a callable"
        )
    return PARSERS[parser]


_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "A tool used to detect the tool-call format.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "A city."}},
            "required": ["city"],
        },
    },
}
_PROBE_CALL = ToolCall("probe_tool", {"city": "Lisbon"})


def detect_parser(tokenizer: Any) -> Parser:
    """Render a known tool call with the tokenizer's template; pick the parser reading it back."""
    if getattr(tokenizer, "response_template", None) is not None:
        return tokenizer_parser(tokenizer)
    rendered = _render_probe(tokenizer)
    for parser in (parse_qwen3_coder, parse_hermes, parse_mistral, parse_llama3):
        calls = parser(rendered).tool_calls
        if [(c.name, c.arguments) for c in calls if isinstance(c, ToolCall)] == [
            (_PROBE_CALL.name, _PROBE_CALL.arguments)
        ]:
            return parser
    raise ValueError(
        "could not tell this chat template's tool-call format; pass parser='hermes', 'llama3', "
        "'mistral', 'qwen3_coder' or a callable. The template rendered a tool call as:\n"
        + rendered[-400:]
    )


def _render_probe(tokenizer: Any) -> str:
    messages = [
        {"role": "user", "content": "Which city?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": _PROBE_CALL.name, "arguments": _PROBE_CALL.arguments},
                }
            ],
        },
    ]
    user_only = tokenizer.apply_chat_template(
        messages[:1], tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
    )
    full = tokenizer.apply_chat_template(messages, tools=[_PROBE_TOOL], tokenize=False)
    reply = full[len(user_only) :] if full.startswith(user_only) else full
    return _strip_end_markers(reply, tokenizer)


def _strip_end_markers(text: str, tokenizer: Any) -> str:
    """Drop the end-of-turn markup after a reply, where generation would have stopped."""
    markers = [*getattr(tokenizer, "all_special_tokens", []), "<|eot_id|>", "<|eom_id|>", "</s>"]
    text = text.rstrip()
    stripped = True
    while stripped:
        stripped = False
        for marker in markers:
            if marker and text.endswith(marker):
                text, stripped = text[: -len(marker)].rstrip(), True
    return text


def _json_or_text(value: str) -> Any:
    """JSON values (numbers, lists, objects, booleans) decoded; anything else kept as text."""
    try:
        return json.loads(value)
    except (json.JSONDecodeError, ValueError):
        return value


def _split_top_level(text: str, separator: str) -> list[str]:
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
