"""Parsers from elsewhere behind toolgym's `Parser` shape: the tokenizer's own
`response_template` (transformers) and vLLM's tool parsers (`vllm:<name>`)."""

from __future__ import annotations

import json
import threading
from typing import Any

from toolgym.agents.parsers.base import AnyCall, ParsedMessage, Parser
from toolgym.envs.calls import MalformedToolCall, ToolCall, tool_call_from_dict


def tokenizer_parser(tokenizer: Any) -> Parser:
    """A parser using the tokenizer's own `response_template` (transformers >= 5)."""
    if getattr(tokenizer, "response_template", None) is None:
        raise ValueError("this tokenizer has no response_template; choose a parser by name")

    def parse(text: str) -> ParsedMessage:
        try:
            # the text starts after the generation prompt: no prompt text to add (`prefix=""`)
            message = tokenizer.parse_response(text, prefix="")
        except TimeoutError:
            raise  # a caller's time limit, not the text's doing
        except Exception as error:  # the template's parser can fail on arbitrary text
            return ParsedMessage(
                text.strip(), [MalformedToolCall(text, f"unreadable response ({error})")]
            )
        calls = [
            tool_call_from_dict(call.get("function", call))
            for call in message.get("tool_calls") or []
        ]
        reasoning = message.get("reasoning_content") or message.get("thinking") or ""
        return ParsedMessage((message.get("content") or "").strip(), calls, reasoning.strip())

    return parse


def vllm_parser(name: str, tokenizer: Any, tools: list[dict] | None = None) -> Parser:
    """vLLM's tool parser `name` (see `vllm.tool_parsers.ToolParserManager.list_registered()`).

    vLLM reads text it cannot parse back as plain content; where the text holds the parser's
    start marker, toolgym reports that as a malformed call instead, so the model is told.
    """
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager
    except ImportError as error:
        raise ValueError(f"parser 'vllm:{name}' needs vLLM installed ({error})") from None
    try:
        parser_class = ToolParserManager.get_tool_parser(name)
    except KeyError:
        known = sorted(ToolParserManager.list_registered())
        raise ValueError(f"vLLM has no tool parser {name!r}; it has {known}") from None
    request: Any = ChatCompletionRequest.model_validate(
        {"model": "toolgym", "messages": [], "tools": tools or None}
    )
    parser = parser_class(tokenizer, request.tools) if tools else parser_class(tokenizer)
    start = getattr(parser, "tool_call_start_token", None) or getattr(parser, "bot_token", None)
    lock = threading.Lock()  # rollouts parse in threads; vLLM's parsers keep state on `self`

    def parse(text: str) -> ParsedMessage:
        try:
            with lock:
                result = parser.extract_tool_calls(text, request)
        except TimeoutError:
            raise  # a caller's time limit, not the text's doing
        except Exception as error:
            return ParsedMessage(text.strip(), [MalformedToolCall(text, f"unreadable ({error})")])
        if not result.tools_called:
            if isinstance(start, str) and start in text:
                return ParsedMessage(
                    text.split(start, 1)[0].strip(),
                    [MalformedToolCall(text, f"vLLM's {name} parser could not read the call")],
                )
            return ParsedMessage((result.content or text).strip())
        calls: list[AnyCall] = [_vllm_call(call) for call in result.tool_calls]
        return ParsedMessage((result.content or "").strip(), calls)

    return parse


def _vllm_call(call: Any) -> AnyCall:
    function = call.function
    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError as error:
        return MalformedToolCall(function.arguments, f"invalid JSON arguments ({error.msg})")
    return ToolCall(function.name, arguments, getattr(call, "id", None))
