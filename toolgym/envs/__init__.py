"""The environment protocol, the registry, the gymnasium view, and the built-in environments."""

from toolgym.envs.adapter import PlainClassEnvironment, as_environment
from toolgym.envs.core import (
    Environment,
    MalformedToolCall,
    StepResult,
    ToolCall,
    ToolError,
    ToolResult,
)
from toolgym.envs.gym import GymnasiumEnv, parse_action
from toolgym.envs.registry import (
    EnvSpec,
    UnknownEnvironmentError,
    list_envs,
    load_entry_points,
    make,
    register,
    spec,
)
from toolgym.envs.tools import Tool, ToolSchemaError

register(
    "Wordle-v0",
    "toolgym.envs.wordle:Wordle",
    dataset="toolgym.envs.wordle:wordle_dataset",
    description="Find a five-letter word in six guesses from colour feedback (guess tool).",
)
register(
    "Arithmetic-v0",
    "toolgym.envs.arithmetic:Arithmetic",
    dataset="toolgym.envs.arithmetic:arithmetic_dataset",
    description="Four-digit arithmetic with calculator tools, graded on the final answer.",
)
register(
    "GuessNumber-v0",
    "toolgym.envs.guess_number:GuessNumber",
    dataset="toolgym.envs.guess_number:guess_number_dataset",
    description="Find a number in 1..100 from higher/lower answers, in as few guesses as possible.",
)

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
