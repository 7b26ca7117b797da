"""Plain tool functions as an environment, as TRL's `tools=[...]` and verifiers take them.

    def search(query: str) -> str:
        '''Search the index.

        Args:
            query: What to look for.
        '''

    env = toolgym.as_environment([search, fetch])   # a stateless environment, two tools

Each function is a tool (its schema from its type hints and Google-style docstring, as for a
method); `reset` accepts any row and shows nothing; there is no reward of the environment's
own (None: reward functions score the episode). A function may be `async`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolgym.envs.hooks import RESERVED_NAMES
from toolgym.envs.tools import FUNCTION_TOOLS, ToolSchemaError


def function_tools(functions: Sequence[Callable[..., Any]], name: str = "FunctionTools") -> Any:
    """An instance of a fresh class whose tools are `functions` (see the module docstring);
    a name that is no tool's (private, a protocol name, repeated) is an error naming it."""
    namespace: dict[str, Any] = {
        FUNCTION_TOOLS: True,
        "__doc__": f"The tool functions {', '.join(_names(functions))}.",
        "reset": _reset,
        "get_reward": _no_reward,
    }
    for function in functions:
        tool = getattr(function, "__name__", None)
        if not callable(function) or not isinstance(tool, str):
            raise ToolSchemaError(f"{function!r} is not a named function; a tool needs a name")
        if tool.startswith("_") or tool in RESERVED_NAMES or tool in namespace:
            why = "private" if tool.startswith("_") else "taken (toolgym's or another tool's)"
            raise ToolSchemaError(
                f"the tool function {tool!r} cannot be a tool: its name is {why}; rename it"
            )
        namespace[tool] = staticmethod(function)
    return type(name, (), namespace)()


def is_function_list(obj: Any) -> bool:
    """Whether `obj` is a list or tuple of plain callables (not an environment)."""
    return (
        isinstance(obj, (list, tuple))
        and bool(obj)
        and all(callable(f) and not isinstance(f, type) for f in obj)
    )


def _reset(self: Any, **row: Any) -> None:
    """Nothing to set up: plain functions keep no state."""


def _no_reward(self: Any) -> None:
    """No reward of its own: reward functions score the episode."""
    return None


def _names(functions: Sequence[Callable[..., Any]]) -> list[str]:
    return [str(getattr(f, "__name__", f)) for f in functions]
