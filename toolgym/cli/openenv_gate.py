"""What bounds `toolgym serve --protocol openenv`: one count of the instances alive at once,
over every way openenv-core's server makes one, and the idle timeout of its WebSockets.

openenv-core makes an instance per `/ws` session, and one per request of its stateless routes
(`POST /reset`, `POST /step`, `GET /state`, `GET /metadata`), outside its own session cap. Here
each such connection or request holds one of `--max-sessions` slots for its lifetime (the
instance is closed before it ends); past them an HTTP request is refused with 503 and a
WebSocket with openenv-core's `CAPACITY_REACHED` error, naming the flag. No live session is
ever closed for a newcomer. A WebSocket whose client sends nothing for `--session-idle-timeout`
seconds, while no message of it is being answered, is told so and closed (its instance too).
openenv-core's `/mcp` routes serve MCP-enabled environments, which toolgym's served ones are
not (their HTTP sessions would live without a timeout): they are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from toolgym.http_guard import Refusal, send_refusal

FREE_ROUTES = frozenset({"/health", "/schema", "/docs", "/redoc", "/openapi.json"})
"""Routes that make no instance."""


class Slots:
    """A count of instances alive at once, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self) -> bool:
        """Take a slot; False when all are in use."""
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        """Give a slot back."""
        self.used -= 1


def gated(app: Any, limit: int, idle_timeout: float, full: str) -> Any:
    """`app` with every instance-making connection or request holding a slot (see the module
    docstring); `full` is the refusal's message."""
    slots = Slots(limit)

    async def gate(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in FREE_ROUTES:
            return await app(scope, receive, send)
        if scope["path"] == "/mcp" or scope["path"].startswith("/mcp/"):
            return await _no_mcp(scope, receive, send)
        if not slots.take():
            if scope["type"] == "websocket":
                return await _full_socket(receive, send, full, limit)
            return await send_refusal(send, Refusal(503, "capacity_reached", full))
        try:
            if scope["type"] == "websocket":
                await _idle_closing(app, scope, receive, send, idle_timeout)
            else:
                await app(scope, receive, send)
        finally:
            slots.give()

    return gate


async def _no_mcp(scope: Any, receive: Any, send: Any) -> None:
    message = (
        "toolgym serve --protocol openenv serves /ws, /reset, /step, /state, /schema, "
        "/metadata and /health; for MCP serve the environment with --protocol mcp"
    )
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": "no /mcp here"})
        return
    await send_refusal(send, Refusal(404, "not_served", message))


async def _full_socket(receive: Any, send: Any, full: str, limit: int) -> None:
    """Accept, say openenv-core's CAPACITY_REACHED (which its client raises), and close."""
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    error = {"message": full, "code": "CAPACITY_REACHED", "max_sessions": limit}
    await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": error})})
    await send({"type": "websocket.close", "code": 1013, "reason": "--max-sessions reached"})


async def _idle_closing(app: Any, scope: Any, receive: Any, send: Any, timeout: float) -> None:
    """Run the WebSocket `app`, closing the connection when the app has waited `timeout`
    seconds for the client's next message (the app then sees a disconnect, and closes the
    session's instance as for any client that leaves)."""
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    state = {"accepted": False, "closed": False}

    async def pump() -> None:
        while True:
            message = await receive()
            await inbox.put(message)
            if message["type"] == "websocket.disconnect":
                return

    async def waiting() -> Any:
        if state["closed"]:
            return {"type": "websocket.disconnect", "code": 1001}
        try:
            return await asyncio.wait_for(inbox.get(), timeout)
        except TimeoutError:
            if not state["accepted"]:
                return await inbox.get()  # the handshake is openenv-core's to finish
            state["closed"] = True
            await _say_idle(send, timeout)
            return {"type": "websocket.disconnect", "code": 1001}

    async def sending(message: Any) -> None:
        if state["closed"]:
            return  # the connection is closed already
        if message["type"] == "websocket.accept":
            state["accepted"] = True
        await send(message)

    reader = asyncio.create_task(pump())
    try:
        await app(scope, waiting, sending)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader


async def _say_idle(send: Any, timeout: float) -> None:
    message = (
        f"the session was idle for {timeout:g} s (--session-idle-timeout) and is closed with "
        "its environment; connect again for a new one"
    )
    error = {"message": message, "code": "SESSION_EXPIRED"}
    with contextlib.suppress(Exception):
        await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": error})})
        await send({"type": "websocket.close", "code": 1001, "reason": "idle past the timeout"})
