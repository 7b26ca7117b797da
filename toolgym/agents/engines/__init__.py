"""Generation backends behind one interface (`Engine`)."""

from toolgym.agents.engines.base import (
    Completion,
    Engine,
    EngineCapabilities,
    GenerationRequest,
    PerRequestEngine,
    SamplingParams,
    capabilities,
)
from toolgym.agents.engines.hf import HFEngine
from toolgym.agents.engines.scripted import ScriptedEngine
from toolgym.agents.engines.server import ServerError, VLLMServerEngine
from toolgym.agents.engines.vllm import VLLMEngine  # imports vllm only when constructed

__all__ = [
    "Completion",
    "Engine",
    "EngineCapabilities",
    "GenerationRequest",
    "HFEngine",
    "PerRequestEngine",
    "SamplingParams",
    "ScriptedEngine",
    "ServerError",
    "VLLMEngine",
    "VLLMServerEngine",
    "capabilities",
]
