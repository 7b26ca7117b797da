"""Google-style docstrings in the forms found in the wild, read by transformers' parser.

`transformers.utils.get_json_schema` (the parser chat templates and TRL rely on) reads an
`Args:` entry only as `name: text`. Code written for Sphinx's napoleon, and suites such as
BFCL, write `name (type): text` or `name (type, optional): text`. `plain_args_docstring`
rewrites those entries to `name: text` (the type and "optional" come from the signature, as
for the plain form), so a method documented either way gets the same schema.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

_ARGS_HEADER = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
_SECTION = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")
_TYPED_ENTRY = re.compile(r"^(\s*)(\w+)\s+\([^()]*(?:\([^()]*\)[^()]*)*\)\s*:(.*)$")


def plain_args_docstring(doc: str) -> str:
    """`doc` with each `name (type): text` entry of its `Args:` section written `name: text`
    (`Arguments:` and `Parameters:` headers become `Args:`); other lines unchanged."""
    lines = doc.splitlines()
    in_args, indent, entry_indent = False, "", -1
    for i, line in enumerate(lines):
        header = _ARGS_HEADER.match(line)
        if header:
            in_args, indent, entry_indent = True, header.group(1), -1
            lines[i] = f"{indent}Args:"
            continue
        if not in_args or not line.strip():
            continue
        if _SECTION.match(line) and _indent(line) <= len(indent):
            in_args = False  # Returns:, Raises:, Example: ... end the arguments
            continue
        if entry_indent < 0:
            entry_indent = _indent(line)  # the entries' indent (deeper lines continue one)
        entry = _TYPED_ENTRY.match(line)
        if entry and _indent(line) == entry_indent:
            lines[i] = f"{entry.group(1)}{entry.group(2)}:{entry.group(3)}"
    return "\n".join(lines)


def with_plain_args(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` itself when its docstring needs no rewriting, else a stand-in with the same
    name, signature and type hints whose docstring is `plain_args_docstring`'s (for reading a
    schema only; it is never called)."""
    doc = inspect.getdoc(function)
    if not doc:
        return function
    plain = plain_args_docstring(doc)
    if plain == doc:
        return function

    @functools.wraps(function)
    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a schema stand-in is never called")

    stand_in.__doc__ = plain
    return stand_in


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
