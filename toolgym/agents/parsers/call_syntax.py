"""Formats that write calls in a function-call syntax: pythonic lists (`[name(k=v)]`, LFM2 and
Llama 4) and Gemma 4's `call:NAME{k:<|"|>text<|"|>,n:3}`."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from toolgym.agents.parsers.base import (
    DECODE_ERRORS,
    AnyCall,
    ParsedMessage,
    before,
    blocks,
    json_or_text,
)
from toolgym.envs.calls import MalformedToolCall, ToolCall

_LFM2 = ("<|tool_call_start|>", "<|tool_call_end|>")
_PYTHONIC_LIST = re.compile(r"^\s*\[\s*[A-Za-z_][\w.\-]*\(", re.DOTALL)


def parse_pythonic(text: str) -> ParsedMessage:
    """`[name(key=value, ...), ...]`, between LFM2's `<|tool_call_start|>` markers or as the
    whole message (Llama 4); values are Python literals."""
    if _LFM2[0] in text:
        calls: list[AnyCall] = []
        for body, _closed in blocks(text, *_LFM2):
            calls.extend(_pythonic_calls(body.strip()))
        return ParsedMessage(before(text, _LFM2[0]), calls)
    if _PYTHONIC_LIST.match(text):
        return ParsedMessage("", _pythonic_calls(text.strip()))
    return ParsedMessage(text.strip())


def _pythonic_calls(source: str) -> list[AnyCall]:
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError as error:
        return [MalformedToolCall(source, f"not a Python list of calls ({error.msg})")]
    except DECODE_ERRORS as error:  # nesting past the recursion limit, memory
        return [MalformedToolCall(source, f"unreadable call ({type(error).__name__})")]
    items = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls: list[AnyCall] = []
    for item in items:
        text = ast.get_source_segment(source, item) or source
        if not isinstance(item, ast.Call) or item.args:
            calls.append(MalformedToolCall(text, "expected name(key=value, ...)"))
            continue
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in item.keywords if kw.arg}
            json.dumps(arguments)  # sets, bytes and complex numbers are no tool arguments
            name = ast.unparse(item.func)
        except (TypeError, *DECODE_ERRORS):
            calls.append(MalformedToolCall(text, "argument values must be JSON-like literals"))
            continue
        calls.append(ToolCall(name, arguments))
    return calls


_GEMMA_CALL = ("<|tool_call>", "<tool_call|>")
_GEMMA_QUOTE = '<|"|>'
_GEMMA_NAME = re.compile(r"\s*call:([^{\s]+)\{")
_GEMMA_THOUGHT = re.compile(r"<\|channel>thought\n?(.*?)(?:<channel\|>|\Z)", re.DOTALL)


def parse_gemma4(text: str) -> ParsedMessage:
    """Gemma 4: `<|tool_call>call:NAME{key:value,...}<tool_call|>` where text values are
    quoted with `<|"|>`; its `<|channel>thought` block is reasoning."""
    reasoning = "\n".join(t.strip() for t in _GEMMA_THOUGHT.findall(text))
    visible = _GEMMA_THOUGHT.sub("", text)
    if _GEMMA_CALL[0] not in visible:
        return ParsedMessage(visible.strip(), [], reasoning)
    calls: list[AnyCall] = []
    for body, closed in blocks(visible, *_GEMMA_CALL):
        calls.append(_gemma_call(body) if closed else MalformedToolCall(body, "cut off"))
    return ParsedMessage(before(visible, _GEMMA_CALL[0]), calls, reasoning)


def _gemma_call(body: str) -> AnyCall:
    match = _GEMMA_NAME.match(body)
    if match is None:
        return MalformedToolCall(body, "expected call:NAME{...}")
    try:
        arguments, end = _GemmaReader(body).mapping(match.end() - 1)
    except (ValueError, RecursionError) as error:
        return MalformedToolCall(body, f"unreadable arguments ({error or type(error).__name__})")
    if body[end:].strip():
        return MalformedToolCall(body, "text after the arguments")
    return ToolCall(match.group(1), arguments)


class _GemmaReader:
    """Reads Gemma 4's argument syntax: `{k:v}`, `[v,...]`, `<|"|>text<|"|>`, bare literals."""

    def __init__(self, text: str) -> None:
        self.text = text

    def value(self, i: int) -> tuple[Any, int]:
        text = self.text
        if text.startswith(_GEMMA_QUOTE, i):
            end = text.find(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
            if end < 0:
                raise ValueError("unterminated text value")
            return text[i + len(_GEMMA_QUOTE) : end], end + len(_GEMMA_QUOTE)
        if text.startswith("{", i):
            return self.mapping(i)
        if text.startswith("[", i):
            return self.sequence(i)
        end = i
        while end < len(text) and text[end] not in ",}]":
            end += 1
        return _bare_literal(text[i:end].strip()), end

    def mapping(self, i: int) -> tuple[dict[str, Any], int]:
        result: dict[str, Any] = {}
        i += 1
        while True:
            i = self._skip(i)
            if self.text.startswith("}", i):
                return result, i + 1
            colon = self.text.find(":", i)
            if colon < 0:
                raise ValueError("expected key:value")
            key = self.text[i:colon].strip().replace(_GEMMA_QUOTE, "")
            result[key], i = self.value(self._skip(colon + 1))
            i = self._skip(i)
            if self.text.startswith(",", i):
                i += 1
            elif not self.text.startswith("}", i):
                raise ValueError("expected , or }")

    def sequence(self, i: int) -> tuple[list[Any], int]:
        result: list[Any] = []
        i += 1
        while True:
            i = self._skip(i)
            if self.text.startswith("]", i):
                return result, i + 1
            item, i = self.value(i)
            result.append(item)
            i = self._skip(i)
            if self.text.startswith(",", i):
                i += 1
            elif not self.text.startswith("]", i):
                raise ValueError("expected , or ]")

    def _skip(self, i: int) -> int:
        if i >= len(self.text):
            raise ValueError("cut off")
        while i < len(self.text) and self.text[i].isspace():
            i += 1
        return i


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _bare_literal(token: str) -> Any:
    """Numbers (as JSON writes them), true/false and null as Gemma writes them; anything else
    stays text (`02134`, `1_000` and `nan` too)."""
    lowered = token.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    if _JSON_NUMBER.fullmatch(token):
        return json_or_text(token)
    return token
