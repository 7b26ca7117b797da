"""The model side of an episode: chat rendering, tool-call parsers, engines, rollouts.

Names load on first use (`from toolgym.agents import Agent` imports the rollout machinery,
`from toolgym.agents import AgentLimits` only the limits), so light users such as the CLI's
`toolgym envs` do not pay for torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.agents.chat import ChatRenderer, TemplateError, TemplateProfile
    from toolgym.agents.chat_clients import ChatClient, EngineClient, OpenAIClient
    from toolgym.agents.compaction import Compaction
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
    from toolgym.agents.simulated_user import SimulatedUser
    from toolgym.agents.subagents import SubAgent
    from toolgym.agents.trajectory import (
        STATUSES,
        Sample,
        Trajectory,
        load_jsonl,
        save_jsonl,
        summarize,
    )

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
