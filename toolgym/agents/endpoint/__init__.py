"""An OpenAI-compatible chat endpoint that records exact tokens (`Endpoint`, in `server`): an
agent program written against the `openai` client trains as it is. Its parts: the HTTP routes
(`app`), the request checks and OpenAI's message shapes (`request`) and the per-session record
with its joining rule (`session`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.agents.endpoint.server import Endpoint

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
