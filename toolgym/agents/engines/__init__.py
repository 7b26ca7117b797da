"""Generation backends behind one interface (`Engine`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
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
    from toolgym.agents.engines.vllm import VLLMEngine

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
