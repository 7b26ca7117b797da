"""toolgym: train LLM agents with reinforcement learning against pluggable environments.

import toolgym

env = toolgym.make("Wordle-v0")
env.reset(answer="crane", seed=0)
result = env.step(toolgym.ToolCall("guess", {"word": "slate"}))

Importing toolgym registers the built-in environments (and, where gymnasium is installed,
their `toolgym/...` gymnasium ids); the rest loads on first use, so a sandbox worker that
imports an environment module needs the standard library only. The public names are the
imports of the `TYPE_CHECKING` block below, listed nowhere else (`toolgym._exports`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym import registry as _registry  # registers the built-ins
from toolgym._exports import lazy_exports as _lazy_exports
from toolgym._exports import package_version as _package_version

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.adapters.mcp import mcp
    from toolgym.adapters.openenv import openenv
    from toolgym.envs.calls import (
        EnvironmentBug,
        EnvironmentFailure,
        EpisodeFailure,
        InfrastructureFailure,
        MalformedToolCall,
        ModelFailure,
        StepResult,
        ToolCall,
        ToolError,
        ToolResult,
    )
    from toolgym.envs.core import Environment
    from toolgym.envs.inline import InlineStep
    from toolgym.envs.stepping import Steppable, Stepper, as_environment
    from toolgym.envs.tools import (
        ProtocolClashError,
        ToolSchemaError,
        ends_episode,
        hook,
        tool_schema,
    )
    from toolgym.gym import GymnasiumEnv
    from toolgym.registry import (
        EnvSpec,
        UnknownEnvironmentError,
        env_factory,
        list_envs,
        make,
        register,
        spec,
    )

__all__, __getattr__, __dir__ = _lazy_exports(
    __name__, __file__, {"__version__": lambda: _package_version("toolgym")}
)
