"""The environment protocol, the registry, the gymnasium view, and the built-in environments."""

from __future__ import annotations

import importlib
from typing import Any

# Names load on first use (PEP 562), so that `toolgym.envs.core` imports with the standard
# library alone: a sandbox worker in a minimal image hosts environments without pydantic,
# transformers, datasets or gymnasium.
_LAZY = {
    "PlainClassEnvironment": "adapter",
    "as_environment": "adapter",
    "Environment": "core",
    "MalformedToolCall": "core",
    "StepResult": "core",
    "ToolCall": "core",
    "ToolError": "core",
    "ToolResult": "core",
    "GymnasiumEnv": "gym",
    "parse_action": "gym",
    "EnvSpec": "registry",
    "UnknownEnvironmentError": "registry",
    "list_envs": "registry",
    "load_entry_points": "registry",
    "make": "registry",
    "register": "registry",
    "spec": "registry",
    "Tool": "tools",
    "ToolSchemaError": "tools",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'toolgym.envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"toolgym.envs.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "EnvSpec",
    "Environment",
    "GymnasiumEnv",
    "MalformedToolCall",
    "PlainClassEnvironment",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSchemaError",
    "UnknownEnvironmentError",
    "as_environment",
    "list_envs",
    "load_entry_points",
    "make",
    "parse_action",
    "register",
    "spec",
]
