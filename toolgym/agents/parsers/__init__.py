"""Tool-call parsers: an assistant's text -> its reasoning, its content and its tool calls.

One parser per tool-call format (`FORMATS` lists each with the families that write it).
`get_parser(name_or_callable, tokenizer)` is the one way to get a parser:

- a name from `PARSERS` (built in, no vLLM needed);
- `"auto"`: render a known tool call with the tokenizer's chat template and pick the parser that
  reads it back exactly (`detect_format`);
- `"tokenizer"`: the tokenizer's own `response_template` through `parse_response`;
- `"vllm:<name>"`: one of vLLM's tool parsers (needs vLLM), for formats not built in;
- any callable `f(text) -> ParsedMessage`.

A leading `<think>...</think>` block is split off as reasoning before a built-in parser reads
the rest; Gemma 4 and harmony parsers read their own reasoning channels.
"""

from __future__ import annotations

from typing import Any

from toolgym.agents.parsers.base import AnyCall, ParsedMessage, Parser, type_arguments
from toolgym.agents.parsers.detect import detect_format, detect_parser
from toolgym.agents.parsers.formats import (
    FORMATS,
    PARSERS,
    PLAIN_PARSERS,
    Format,
    parser_for_template,
)
from toolgym.agents.parsers.library import tokenizer_parser, vllm_parser


def get_parser(parser: str | Parser, tokenizer: Any = None, **template_kwargs: Any) -> Parser:
    """A parser by name (`PARSERS`, `"auto"`, `"tokenizer"`, `"vllm:<name>"`) or the callable.

    `template_kwargs` (e.g. `chat_template`, `enable_thinking`) go to the chat template when
    `"auto"` renders its probe.
    """
    if callable(parser):
        return parser
    if parser == "tokenizer":
        return tokenizer_parser(tokenizer)
    if parser == "auto":
        return detect_parser(tokenizer, **template_kwargs)
    if parser.startswith("vllm:"):
        return vllm_parser(parser.removeprefix("vllm:"), tokenizer)
    if parser not in PARSERS:
        raise ValueError(
            f"unknown parser {parser!r}; choose one of {sorted(PARSERS)}, 'auto', 'tokenizer', "
            "'vllm:<name>', or pass a callable"
        )
    if tokenizer is None:
        return PARSERS[parser]
    template = template_kwargs.get("chat_template") or getattr(tokenizer, "chat_template", None)
    return parser_for_template(parser, template)


__all__ = [
    "FORMATS",
    "PARSERS",
    "PLAIN_PARSERS",
    "AnyCall",
    "Format",
    "ParsedMessage",
    "Parser",
    "detect_format",
    "detect_parser",
    "get_parser",
    "tokenizer_parser",
    "type_arguments",
    "vllm_parser",
]
