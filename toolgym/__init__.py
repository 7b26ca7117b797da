"""toolgym: train LLM agents with reinforcement learning against pluggable environments.

import toolgym

env = toolgym.make("Wordle-v0")
env.reset(answer="crane", seed=0)
result = env.step(toolgym.ToolCall("guess", {"word": "slate"}))

Importing toolgym registers the built-in environments (and, where gymnasium is installed,
their `toolgym/...` gymnasium ids); the rest loads on first use, so a sandbox worker that
imports an environment module needs the standard library only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolgym import registry as _registry  # noqa: F401 (registers the built-ins)

if TYPE_CHECKING:
    from toolgym.envs.calls import (
        MalformedToolCall,
        StepResult,
        ToolCall,
        ToolError,
        ToolResult,
    )
    from toolgym.envs.core import Environment
    from toolgym.envs.inline import InlineStep
    from toolgym.envs.stepping import Stepper, as_environment
    from toolgym.envs.tools import ProtocolClashError, ToolSchemaError, ends_episode, hook
    from toolgym.gym import GymnasiumEnv
    from toolgym.registry import (
        EnvSpec,
        UnknownEnvironmentError,
        list_envs,
        make,
        register,
        spec,
    )

__version__ = "0.1.0"

_HOMES = {
    "Environment": "toolgym.envs.core",
    "InlineStep": "toolgym.envs.inline",
    "MalformedToolCall": "toolgym.envs.calls",
    "StepResult": "toolgym.envs.calls",
    "ToolCall": "toolgym.envs.calls",
    "ToolError": "toolgym.envs.calls",
    "ToolResult": "toolgym.envs.calls",
    "Stepper": "toolgym.envs.stepping",
    "as_environment": "toolgym.envs.stepping",
    "ToolSchemaError": "toolgym.envs.tools",
    "ProtocolClashError": "toolgym.envs.tools",
    "ends_episode": "toolgym.envs.tools",
    "hook": "toolgym.envs.tools",
    "GymnasiumEnv": "toolgym.gym",
    "EnvSpec": "toolgym.registry",
    "UnknownEnvironmentError": "toolgym.registry",
    "list_envs": "toolgym.registry",
    "make": "toolgym.registry",
    "register": "toolgym.registry",
    "spec": "toolgym.registry",
}

__all__ = [
    "EnvSpec",
    "Environment",
    "GymnasiumEnv",
    "InlineStep",
    "MalformedToolCall",
    "ProtocolClashError",
    "StepResult",
    "Stepper",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSchemaError",
    "UnknownEnvironmentError",
    "__version__",
    "as_environment",
    "ends_episode",
    "hook",
    "list_envs",
    "make",
    "register",
    "spec",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'toolgym' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
