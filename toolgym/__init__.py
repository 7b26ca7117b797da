"""toolgym: train LLM agents with reinforcement learning against pluggable environments.

import toolgym

env = toolgym.make("Wordle-v0")
env.reset(answer="crane", seed=0)
result = env.step(toolgym.ToolCall("guess", {"word": "slate"}))
"""

from toolgym.envs import (
    Environment,
    EnvSpec,
    GymnasiumEnv,
    MalformedToolCall,
    StepResult,
    ToolCall,
    ToolError,
    ToolResult,
    ToolSchemaError,
    UnknownEnvironmentError,
    as_environment,
    list_envs,
    make,
    register,
    spec,
)

__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "Environment",
    "GymnasiumEnv",
    "MalformedToolCall",
    "StepResult",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSchemaError",
    "UnknownEnvironmentError",
    "__version__",
    "as_environment",
    "list_envs",
    "make",
    "register",
    "spec",
]
