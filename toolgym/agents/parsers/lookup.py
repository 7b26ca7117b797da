"""`get_parser`: a parser by name, by detection on the chat template, or the callable given."""

from __future__ import annotations

from typing import Any

from toolgym.agents.parsers.base import Parser
from toolgym.agents.parsers.detect import detect_parser
from toolgym.agents.parsers.formats import PARSERS, parser_for_template
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
