"""One adapter that lets a plain class stand wherever an `Environment` is expected.

A plain class with `reset(**kwargs)` and public methods (the shape TRL's `environment_factory`
accepts) runs unchanged: its public methods are its tools, `get_reward()` or a `reward`
attribute gives the reward, and a `done` attribute, if it has one, ends the episode.
"""

from __future__ import annotations

import weakref
from typing import Any

from toolgym.envs.core import Environment, accepted_kwargs
from toolgym.envs.tools import Tool, collect_tools

# Methods of a plain class that are protocol, not tools.
PLAIN_CLASS_API = {"reset", "close", "get_reward", "step", "final_answer"}

_tool_tables: weakref.WeakKeyDictionary[type, dict[str, Tool]] = weakref.WeakKeyDictionary()


class PlainClassEnvironment(Environment):
    """An `Environment` view of an object that does not subclass `Environment`."""

    def __init__(self, wrapped: object) -> None:
        if not callable(getattr(wrapped, "reset", None)):
            raise TypeError(
                f"{type(wrapped).__name__} cannot be used as an environment: it has no reset() "
                "method. An environment needs reset(**kwargs) and public methods as tools."
            )
        self.wrapped = wrapped
        self.max_turns = getattr(wrapped, "max_turns", None)
        self._table = plain_class_tools(type(wrapped))
        self._pass_kwargs = accepted_kwargs(wrapped.reset)

    def reset(self, **row: Any) -> str | None:
        # The base class has already seeded `rng` and cleared the episode; `row` has `seed`.
        return self.wrapped.reset(**self._pass_kwargs(row))

    def close(self) -> None:
        close = getattr(self.wrapped, "close", None)
        if callable(close):
            close()

    def get_reward(self) -> float:
        get_reward = getattr(self.wrapped, "get_reward", None)
        if callable(get_reward):
            return float(get_reward())
        return float(getattr(self.wrapped, "reward", 0.0))

    def final_answer(self, text: str) -> None:
        final_answer = getattr(self.wrapped, "final_answer", None)
        if callable(final_answer):
            final_answer(text)

    @property  # type: ignore[override]
    def done(self) -> bool:
        return bool(getattr(self.wrapped, "done", False))

    @done.setter
    def done(self, value: bool) -> None:
        if hasattr(self.wrapped, "done"):
            self.wrapped.done = value

    def _tool_table(self) -> dict[str, Tool]:
        return self._table

    def _tool_owner(self) -> object:
        return self.wrapped

    def __repr__(self) -> str:
        return f"PlainClassEnvironment({type(self.wrapped).__name__})"


def as_environment(obj: object) -> Environment:
    """Return `obj` itself if it is an `Environment`, else the adapter around it."""
    if isinstance(obj, Environment):
        return obj
    return PlainClassEnvironment(obj)


def plain_class_tools(cls: type) -> dict[str, Tool]:
    """The tools of a plain class (built once per class)."""
    if cls not in _tool_tables:
        _tool_tables[cls] = collect_tools(cls, exclude=PLAIN_CLASS_API)
    return _tool_tables[cls]
