"""Formats that write calls in a function-call syntax: pythonic lists (`[name(k=v)]`, LFM2 and
Llama 4) and Gemma 4's `call:NAME{k:<|"|>text<|"|>,n:3}`."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from toolgym.agents.parsers.base import (
    DECODE_ERRORS,
    MAX_CALLS,
    AnyCall,
    ParsedMessage,
    before,
    blocks,
    capped,
    too_many_calls,
)
from toolgym.envs.calls import MalformedToolCall, ToolCall

_LFM2 = ("<|tool_call_start|>", "<|tool_call_end|>")
_LLAMA4 = ("<|python_start|>", "<|python_end|>")
_OLMO3 = ("<function_calls>", "</function_calls>")
_PYTHONIC_LIST = re.compile(r"^\s*\[\s*[A-Za-z_][\w.\-]*\(", re.DOTALL)


def parse_pythonic(text: str) -> ParsedMessage:
    """`[name(key=value, ...), ...]`, between LFM2's `<|tool_call_start|>` markers or Llama 4's
    `<|python_start|>` ones, or as the whole message (Llama 4); or one call per line, without
    brackets, in OLMo 3's `<function_calls>`. Values are Python literals (or JSON's `true`,
    `false`, `null`)."""
    if _OLMO3[0] in text:  # one call per line, no list brackets
        bodies = blocks(text, *_OLMO3)
        found = (call for body, _ in bodies for call in _statement_calls(body.strip()))
        return ParsedMessage(before(text, _OLMO3[0]), capped(found, text))
    for markers in (_LFM2, _LLAMA4):
        if markers[0] in text:
            bodies = blocks(text, *markers)
            found = (call for body, _ in bodies for call in _pythonic_calls(body.strip()))
            return ParsedMessage(before(text, markers[0]), capped(found, text))
    if _PYTHONIC_LIST.match(text):
        return ParsedMessage("", _pythonic_calls(text.strip()))
    return ParsedMessage(text.strip())


def _pythonic_calls(source: str) -> list[AnyCall]:
    """The calls in one list (its first `MAX_CALLS`, and a malformed call naming the cap where
    it holds more: only those are parsed)."""
    cut = _cut_after_calls(source)
    if cut is not None:
        return [*_pythonic_calls(source[:cut] + "]"), MalformedToolCall(source, too_many_calls())]
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError as error:
        return [MalformedToolCall(source, f"not a Python list of calls ({error.msg})")]
    except DECODE_ERRORS as error:  # nesting past the recursion limit, memory
        return [MalformedToolCall(source, f"unreadable call ({type(error).__name__})")]
    items = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    segments = _Segments(source)
    return capped((_pythonic_call(item, segments.of(item) or source) for item in items), source)


def _statement_calls(source: str) -> list[AnyCall]:
    """Calls one per line (Python statements), or one list of them. Past `MAX_CALLS` lines, the
    first lines are read alone when they already hold more calls than are read."""
    lines = source.split("\n", MAX_CALLS + 1)
    if len(lines) > MAX_CALLS + 1:
        head = _statement_calls("\n".join(lines[: MAX_CALLS + 1]))
        if len(head) > MAX_CALLS:
            return head
    try:
        statements = ast.parse(source, mode="exec").body
    except SyntaxError as error:
        return [MalformedToolCall(source, f"not Python calls, one per line ({error.msg})")]
    except DECODE_ERRORS as error:
        return [MalformedToolCall(source, f"unreadable call ({type(error).__name__})")]
    items: list[ast.AST] = [s.value if isinstance(s, ast.Expr) else s for s in statements]
    if len(items) == 1 and isinstance(items[0], (ast.List, ast.Tuple)):
        items = list(items[0].elts)
    if not items:
        return [MalformedToolCall(source, "a tool-call block without a call")]
    segments = _Segments(source)
    return capped((_pythonic_call(item, segments.of(item) or source) for item in items), source)


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    return ast.literal_eval(node)


def _pythonic_call(item: ast.AST, text: str) -> AnyCall:
    if not isinstance(item, ast.Call) or item.args:
        return MalformedToolCall(text, "expected name(key=value, ...)")
    try:
        arguments = {kw.arg: _literal(kw.value) for kw in item.keywords if kw.arg}
        json.dumps(arguments)  # sets, bytes and complex numbers are no tool arguments
        name = ast.unparse(item.func)
    except (TypeError, *DECODE_ERRORS):
        return MalformedToolCall(text, "argument values must be JSON-like literals")
    return ToolCall(name, arguments)


_STRUCTURE = re.compile(r"""[\[\](){},#'"]""")
_STRING_ENDS = {
    quote: re.compile(pattern, re.DOTALL)
    for quote, pattern in (
        ("'", r"[^'\\\n]*(?:\\.[^'\\\n]*)*'"),
        ('"', r'[^"\\\n]*(?:\\.[^"\\\n]*)*"'),
        ("'''", r"[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"),
        ('"""', r'[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'),
    )
}


def _cut_after_calls(source: str) -> int | None:
    """Where a list of more than `MAX_CALLS` calls has its `MAX_CALLS`-th top-level comma (None
    for a shorter list, or text that is no list): Python's own parser then reads only the
    calls before it. One forward pass over brackets, commas, strings and comments, for lists
    with more opening parentheses than `MAX_CALLS` (one per call)."""
    if not source.startswith("[") or source.count("(") <= MAX_CALLS:
        return None
    depth, commas, position = 0, 0, 0
    while (match := _STRUCTURE.search(source, position)) is not None:
        char, position = match.group(), match.end()
        if char in "[({":
            depth += 1
        elif char in "])}":
            depth -= 1
            if depth <= 0:
                return None  # the list closed first
        elif char == ",":
            commas += depth == 1
            if commas == MAX_CALLS:
                rest = source[position:].lstrip()
                return match.start() if rest and not rest.startswith("]") else None
        elif char == "#":
            position = source.find("\n", position)
            if position < 0:
                return None
        else:
            quote = char * 3 if source.startswith(char * 3, match.start()) else char
            end = _STRING_ENDS[quote].match(source, match.start() + len(quote))
            if end is None:
                return None  # unterminated: Python's parser says so
            position = end.end()
    return None


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


class _Segments:
    """`ast.get_source_segment` for many nodes of one source, in time linear in the source and
    the segments (`ast.get_source_segment` splits the whole source into lines, character by
    character, for each node: quadratic over a long list of calls)."""

    def __init__(self, source: str) -> None:
        self.lines = [line.encode() for line in _LINE.findall(source)]  # as Python's parser does

    def of(self, node: ast.AST) -> str | None:
        start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        first, last = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
        if start is None or end is None or first is None or last is None:
            return None
        lines = self.lines
        if start == end:
            return lines[start - 1][first:last].decode()
        middle = b"".join(lines[start : end - 1])
        return (lines[start - 1][first:] + middle + lines[end - 1][:last]).decode()


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
    found = (
        _gemma_call(body) if closed else MalformedToolCall(body, "cut off")
        for body, closed in blocks(visible, *_GEMMA_CALL)
    )
    return ParsedMessage(before(visible, _GEMMA_CALL[0]), capped(found, visible), reasoning)


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


_FUNCTIONGEMMA = ("<start_function_call>", "<end_function_call>")


def parse_functiongemma(text: str) -> ParsedMessage:
    """FunctionGemma: `<start_function_call>call:NAME{key:<escape>text<escape>,n:3}
    <end_function_call>`, Gemma 4's syntax with `<escape>` quoting text values."""
    if _FUNCTIONGEMMA[0] not in text:
        return ParsedMessage(text.strip())
    found = (
        _gemma_call(body.replace("<escape>", _GEMMA_QUOTE))
        if closed
        else MalformedToolCall(body, "cut off")
        for body, closed in blocks(text, *_FUNCTIONGEMMA)
    )
    return ParsedMessage(before(text, _FUNCTIONGEMMA[0]), capped(found, text))


_BARE = re.compile(r"[^,}\]]*")
_SPACE = re.compile(r"\s*")


def _matched_end(pattern: re.Pattern[str], text: str, i: int) -> int:
    """Where `pattern`, which matches anywhere (perhaps nothing), ends when matched at `i`."""
    match = pattern.match(text, i)
    return i if match is None else match.end()


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
        end = _matched_end(_BARE, text, i)
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
        return _matched_end(_SPACE, self.text, i)


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _bare_literal(token: str) -> Any:
    """Numbers (as JSON writes them), true/false and null as Gemma writes them; anything else
    stays text (`02134`, `1_000` and `nan` too)."""
    lowered = token.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    if _JSON_NUMBER.fullmatch(token):  # as JSON reads it: float() where it has . or e
        try:
            return float(token) if token.strip("-0123456789") else int(token)
        except ValueError:  # more digits than Python converts
            return token
    return token
