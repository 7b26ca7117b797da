"""The model side of an episode: chat rendering, tool-call parsers, engines, rollouts."""

from toolgym.agents.chat import ChatRenderer, TemplateError
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
from toolgym.agents.parsers import PARSERS, ParsedMessage, get_parser
from toolgym.agents.rollout import Agent, AgentLimits
from toolgym.agents.trajectory import STATUSES, Trajectory, load_jsonl, save_jsonl

__all__ = [
    "PARSERS",
    "STATUSES",
    "Agent",
    "AgentLimits",
    "ChatRenderer",
    "Completion",
    "Engine",
    "GenerationRequest",
    "HFEngine",
    "ParsedMessage",
    "SamplingParams",
    "ScriptedEngine",
    "TemplateError",
    "Trajectory",
    "VLLMEngine",
    "VLLMServerEngine",
    "get_parser",
    "load_jsonl",
    "save_jsonl",
]
