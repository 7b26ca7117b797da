"""The model side of an episode: chat rendering, tool-call parsers, engines, rollouts.

Names load on first use (`from toolgym.agents import Agent` imports the rollout machinery,
`from toolgym.agents import AgentLimits` only the limits), so light users such as the CLI's
`toolgym envs` do not pay for torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers and editors
    from toolgym.agents.chat import ChatRenderer, TemplateError
    from toolgym.agents.custom import EpisodeEnd, Generation, RolloutContext, RolloutFn
    from toolgym.agents.engines import (
        Completion,
        Engine,
        GenerationRequest,
        HFEngine,
        SamplingParams,
        ScriptedEngine,
        VLLMEngine,
        VLLMServerEngine,
    )
    from toolgym.agents.limits import AgentLimits
    from toolgym.agents.parsers import PARSERS, ParsedMessage, get_parser
    from toolgym.agents.rollout import Agent
    from toolgym.agents.trajectory import STATUSES, Trajectory, load_jsonl, save_jsonl, summarize

_HOMES = {
    "PARSERS": "parsers",
    "ParsedMessage": "parsers",
    "get_parser": "parsers",
    "STATUSES": "trajectory",
    "Trajectory": "trajectory",
    "load_jsonl": "trajectory",
    "save_jsonl": "trajectory",
    "summarize": "trajectory",
    "Agent": "rollout",
    "EpisodeEnd": "custom",
    "Generation": "custom",
    "RolloutContext": "custom",
    "RolloutFn": "custom",
    "AgentLimits": "limits",
    "ChatRenderer": "chat",
    "TemplateError": "chat",
    "Completion": "engines",
    "Engine": "engines",
    "GenerationRequest": "engines",
    "HFEngine": "engines",
    "SamplingParams": "engines",
    "ScriptedEngine": "engines",
    "VLLMEngine": "engines",
    "VLLMServerEngine": "engines",
}

__all__ = [
    "PARSERS",
    "STATUSES",
    "Agent",
    "AgentLimits",
    "ChatRenderer",
    "Completion",
    "Engine",
    "EpisodeEnd",
    "Generation",
    "GenerationRequest",
    "HFEngine",
    "ParsedMessage",
    "RolloutContext",
    "RolloutFn",
    "SamplingParams",
    "ScriptedEngine",
    "TemplateError",
    "Trajectory",
    "VLLMEngine",
    "VLLMServerEngine",
    "get_parser",
    "load_jsonl",
    "save_jsonl",
    "summarize",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'toolgym.agents' has no attribute {name!r}")
    return getattr(importlib.import_module(f"toolgym.agents.{_HOMES[name]}"), name)


def __dir__() -> list[str]:
    return __all__
