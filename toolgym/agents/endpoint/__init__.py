"""An OpenAI-compatible chat endpoint that records exact tokens (`Endpoint`, in `server`): an
agent program written against the `openai` client trains as it is. Its parts: the HTTP routes
(`app`), the request checks and OpenAI's message shapes (`request`) and the per-session record
with its joining rule (`session`).
"""

from toolgym.agents.endpoint.server import Endpoint

__all__ = ["Endpoint"]
