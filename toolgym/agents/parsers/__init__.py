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

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.agents.parsers.base import AnyCall, ParsedMessage, Parser, type_arguments
    from toolgym.agents.parsers.detect import detect_format, detect_parser
    from toolgym.agents.parsers.formats import FORMATS, PARSERS, PLAIN_PARSERS, Format
    from toolgym.agents.parsers.library import tokenizer_parser, vllm_parser
    from toolgym.agents.parsers.lookup import get_parser

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
