"""The shape of the code: rooms that import each other in one direction only, and small
functions. Imports are read from the source (top-level and function-local alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "toolgym"
LAYERS = ["envs", "sandbox", "registry", "agents", "gym", "algorithms", "testing", "cli"]
"""Rooms from the bottom up: each may import only the rooms before it (and `toolgym` itself,
the package's public surface, from `agents` on)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every toolgym module `path` imports (a `from a import b` counts `a.b` when b is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("toolgym"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("toolgym"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else node.module)
    return found


def _is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").exists() or (PACKAGE / relative).is_dir()


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "toolgym"


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports_of(path) & set(modules) - {name} for name, path in modules.items()}


def test_rooms_import_each_other_in_one_direction():
    wrong = []
    for module, imported in graph().items():
        mine = room(module)
        if mine == "toolgym":
            continue  # the package surface names every room's public objects
        for other in imported:
            theirs = room(other)
            if theirs == mine:
                continue
            if theirs == "toolgym":
                allowed = LAYERS.index(mine) >= LAYERS.index("agents")
            else:
                allowed = LAYERS.index(theirs) < LAYERS.index(mine)
            if not allowed:
                wrong.append(f"{module} -> {other}")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles_between_modules():
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize("limit", [60])
def test_no_function_is_longer_than_a_screen(limit):
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    long.append(f"{module_name(path)}.{node.name}: {length} lines")
    assert not long, "\n".join(long)
