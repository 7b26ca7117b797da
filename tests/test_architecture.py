"""The shape of the code: rooms that import each other in one direction only, and small
functions. Imports are read from the source (top-level and function-local alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import toolgym

PACKAGE = Path(__file__).resolve().parent.parent / "toolgym"
LAYERS = [
    "_exports",  # the lazy-export helper every package surface uses (standard library only)
    "http_guard",  # who may talk to a listening server (standard library only)
    "envs",  # the environment kernel: protocol, tools, stepping
    "adapters",  # MCP and OpenEnv servers as environments
    "sandbox",
    "builtin_envs",  # the environments toolgym ships
    "registry",
    "agents",
    "gym",
    "judges",  # rewards a judge model gives
    "runtime",  # a training process's budget, stage clock, heap and launcher watch
    "algorithms",
    "trl",  # TRL's names over the trainer (toolgym.trl)
    "testing",
    "viewer",
    "cli",
    "__main__",
]
"""Rooms from the bottom up: each may import only the rooms before it (and `toolgym` itself,
the package's public surface, from `agents` on)."""


def module_name(path: Path) -> str:
    """`toolgym/envs/core.py` -> `toolgym.envs.core` (a package's `__init__` -> the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every toolgym module `path` imports: `import`, `from ... import` (relative ones
    resolved; `from a import b` counts `a.b` when b is a module) and
    `importlib.import_module("toolgym....")` with a literal name."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("toolgym"))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            if base.startswith("toolgym"):
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if _is_module(candidate) else base)
        elif isinstance(node, ast.Call) and _is_import_module(node):
            found.add(node.args[0].value.partition(":")[0])
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _is_import_module(node: ast.Call) -> bool:
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return (
        name == "import_module"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and str(node.args[0].value).startswith("toolgym")
    )


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


def test_the_checker_sees_relative_and_dynamic_imports(tmp_path, monkeypatch):
    """The reader of imports is not blind to the forms this codebase does not use today."""
    module = PACKAGE / "envs" / "probe_for_the_checker.py"
    module.write_text(
        "from ..agents import rollout\n"
        "from . import core\n"
        "import importlib\n"
        "importlib.import_module('toolgym.algorithms.grpo')\n"
    )
    try:
        assert imports_of(module) == {
            "toolgym.agents.rollout",
            "toolgym.envs.core",
            "toolgym.algorithms.grpo",
        }
    finally:
        module.unlink()


def test_a_sandbox_worker_imports_no_heavy_library():
    """Importing the worker and a built-in environment (what a worker does) loads only the
    standard library: a minimal image, and a fast start, need nothing else."""
    import subprocess
    import sys

    heavy = ("numpy", "gymnasium", "torch", "transformers", "pydantic", "datasets", "vllm")
    code = (
        "import sys, toolgym.sandbox.worker, toolgym.builtin_envs.python_repl\n"
        "import toolgym.builtin_envs.wordle\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]", loaded


def test_public_names_are_listed_once_and_all_resolve():
    """Every package with public names exports exactly the imports of its `TYPE_CHECKING`
    block (one list, read by type checkers and by the lazy loader), each of which loads: one
    style of package face."""
    import importlib

    from toolgym._exports import exported_names

    faces = [p for p in PACKAGE.rglob("__init__.py") if "lazy_exports(" in p.read_text()]
    packages = sorted(module_name(p) for p in faces)
    assert {"toolgym", "toolgym.agents", "toolgym.algorithms", "toolgym.sandbox"} <= set(packages)
    eager = [
        module_name(p)
        for p in PACKAGE.rglob("__init__.py")
        if p not in faces and "__all__" in p.read_text() and module_name(p) != "toolgym.cli"
    ]
    assert not eager, f"package faces that import eagerly: {eager}"
    for package in packages:
        module = importlib.import_module(package)
        listed = exported_names(module.__file__)
        assert set(module.__all__) - {"__version__"} == set(listed)
        for name, home in listed.items():
            assert getattr(module, name) is getattr(importlib.import_module(home), name)
        assert dir(module) == module.__all__
        with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
            module.nothing_here  # noqa: B018


def test_the_version_comes_from_the_package_metadata():
    from importlib import metadata

    import toolgym

    assert toolgym.__version__ == metadata.version("toolgym")


def test_importing_toolgym_starts_no_thread_and_no_exit_handler():
    """Importing the package and its sandbox backends starts no thread, makes no pool and
    registers no exit handler: those come with the first worker or container."""
    import subprocess
    import sys

    code = (
        "import atexit, threading\n"
        "registered = []\n"
        "atexit.register = lambda f, *a, **k: registered.append(f.__module__)\n"
        "import toolgym, toolgym.agents, toolgym.sandbox.process, toolgym.sandbox.docker\n"
        "print(threading.active_count(), sorted(set(m for m in registered if 'toolgym' in m)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1 []", done.stdout + done.stderr


def test_the_protocol_s_names_are_environment_s_public_names():
    """The one table of the protocol (`toolgym.envs.hooks`) names exactly what the
    `Environment` base class defines in public: a hook added to one and not the other fails
    here, not as a tool that silently shadows it."""
    from toolgym.envs.core import Environment
    from toolgym.envs.hooks import INVOKABLE, RESERVED_NAMES
    from toolgym.envs.stepping import LocalExecutor
    from toolgym.sandbox.remote import RemoteExecutor

    assert {name for name in dir(Environment) if not name.startswith("_")} == RESERVED_NAMES
    for executor in (LocalExecutor, RemoteExecutor):  # the worker serves each hook by them
        assert all(callable(getattr(executor, method, None)) for method in INVOKABLE.values())


def test_what_as_environment_returns_is_steppable():
    """The named protocol (`toolgym.Steppable`) covers what the agent loop plays: an
    `Environment`, a Stepper over a plain class, and a sandboxed instance (mypy checks the
    Environment statically; this checks the members at run time)."""
    from toolgym.envs.stepping import Steppable

    members = [name for name in vars(Steppable) if not name.startswith("_") and name != "tools"] + [
        "tools"
    ]

    class Plain:
        def reset(self, **kwargs):
            return None

    for env in (toolgym.make("Wordle-v0"), toolgym.as_environment(Plain())):
        steppable = toolgym.as_environment(env)
        assert all(hasattr(steppable, name) for name in members), type(steppable)
