"""Lazy public names, listed once.

A package's `__init__` lists its public names in one `if TYPE_CHECKING:` block of
`from module import name` lines, which type checkers and editors read. `lazy_exports` reads
the same block back (with `ast`, standard library only) into the table `__getattr__` loads
from on first use, so no name is written twice and nothing heavy loads at import.

    if TYPE_CHECKING:
        from toolgym.envs.core import Environment

    __all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def exported_names(init_file: str) -> dict[str, str]:
    """`{name: module}` for each `from module import name` in the file's `if TYPE_CHECKING:`
    block, in order."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    homes: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    for alias in statement.names:
                        homes[alias.asname or alias.name] = statement.module
    if not homes:
        raise RuntimeError(f"{init_file} has no `if TYPE_CHECKING:` block of imports to export")
    return homes


def lazy_exports(
    package: str, init_file: str, extra: dict[str, Callable[[], Any]] | None = None
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """`(__all__, __getattr__, __dir__)` for `package`, whose names load on first use;
    `extra` maps further names to functions computing them (e.g. `__version__`)."""
    homes = exported_names(init_file)
    computed = dict(extra or {})
    names = sorted([*homes, *computed])

    def __getattr__(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        if name in computed:
            return computed[name]()
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return names

    return names, __getattr__, __dir__


def package_version(distribution: str) -> str:
    """The installed distribution's version (from its metadata), `0+unknown` when it is not
    installed (run from a source tree)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
