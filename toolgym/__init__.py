"""toolgym: train LLM agents with reinforcement learning against pluggable environments.

import toolgym

env = toolgym.make("Wordle-v0")
env.reset(answer="crane", seed=0)
result = env.step(toolgym.ToolCall("guess", {"word": "slate"}))
"""

import os
from typing import Any

from toolgym import envs as _envs

if os.environ.get("TOOLGYM_WORKER") != "1":
    # Registers the built-in environments (also under gymnasium's "toolgym/" namespace). A
    # sandbox worker skips it: it needs only the environment's own module (standard library).
    from toolgym.envs import registry as _registry  # noqa: F401

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


def __getattr__(name: str) -> Any:
    # Lazy (see toolgym/envs/__init__.py): `import toolgym` stays light until a name is used.
    if name in __all__ and name != "__version__":
        return getattr(_envs, name)
    raise AttributeError(f"module 'toolgym' has no attribute {name!r}")
