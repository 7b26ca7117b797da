"""Generation backends behind one interface (`Engine`)."""

from toolgym.agents.engines.base import Completion, Engine, GenerationRequest, SamplingParams
from toolgym.agents.engines.hf import HFEngine
from toolgym.agents.engines.scripted import ScriptedEngine

__all__ = [
    "Completion",
    "Engine",
    "GenerationRequest",
    "HFEngine",
    "SamplingParams",
    "ScriptedEngine",
]
