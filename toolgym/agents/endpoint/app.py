"""The HTTP side of `Endpoint`: OpenAI's routes on Starlette (served by uvicorn).

Sessions come from the `X-Session-Id` header, else the API key (`Authorization: Bearer
<key>`), else the body's `user` field. Every request first passes the endpoint's `Guard`
(`toolgym.http_guard`: its own Host, no foreign Origin, JSON bodies only, the token
where one is set). With a token the API key may be the token itself (the session then comes
from `X-Session-Id` or `user`) or `TOKEN:SESSION`; or the token travels as `X-Toolgym-Token`
and the API key names the session as without one. Errors are OpenAI's shape (`{"error": {"message",
"type", "code"}}`) with a fitting HTTP status; nothing a request sends crashes the server.
With `stream: true` the answer comes as server-sent events in OpenAI's chunk shape, after the
completion is generated (one content delta, one tool-call delta, the finish, `[DONE]`).
Any other route or method gets an OpenAI-style 404/405 that names what is served (the
Responses API is not: agent libraries that default to it, like the OpenAI Agents SDK, take
their chat-completions model instead).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from toolgym.http_guard import Guard

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

MAX_BODY_BYTES = 8 * 2**20
"""A request body past this is refused (413) before it is read further."""


class EndpointError(Exception):
    """An OpenAI-style error answer: HTTP status, message, type and code."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI's clients read (`error.message`, `type`, `code`)."""
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


class Completer(Protocol):
    """What the app serves: `Endpoint` (named here by shape, so the two modules do not
    import each other)."""

    model_name: str

    async def complete(self, key: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion for session `key`, in OpenAI's shape."""
        ...


def build_app(endpoint: Completer, guard: Guard | None = None) -> Any:
    """The ASGI app serving `endpoint` behind `guard` (default: loopback's, no token);
    Starlette is imported here, at start."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": endpoint.model_name, "object": "model", "owned_by": "toolgym"}],
            }
        )

    async def chat_completions(request: Request) -> Response:
        try:
            body = await _json_body(request)
            key = _session_key(request, body, checks)
            answer = await endpoint.complete(key, body)
        except EndpointError as error:
            return JSONResponse(error.body(), status_code=error.status)
        except Exception as error:  # a bug here must answer, not drop the connection
            failure = EndpointError(500, f"{type(error).__name__}: {error}", "internal_error")
            return JSONResponse(failure.body(), status_code=500)
        if body.get("stream"):
            return StreamingResponse(_events(answer), media_type="text/event-stream")
        return JSONResponse(answer)

    async def not_served(request: Request, error: Exception) -> Response:
        status = getattr(error, "status_code", 404)
        message = (
            f"{request.method} {request.url.path} is not served: this endpoint serves POST "
            "/v1/chat/completions and GET /v1/models (not the Responses API; with the OpenAI "
            "Agents SDK use OpenAIChatCompletionsModel or set_default_openai_api"
            "('chat_completions'))"
        )
        code = "not_found" if status == 404 else "method_not_allowed"
        return JSONResponse(EndpointError(status, message, code).body(), status_code=status)

    checks = guard or Guard("127.0.0.1")
    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        exception_handlers={404: not_served, 405: not_served},
    )
    return checks.asgi(app)


async def _json_body(request: Request) -> dict[str, Any]:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise EndpointError(413, f"the body is over {MAX_BODY_BYTES} bytes", "body_too_large")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise EndpointError(413, f"the body is over {MAX_BODY_BYTES} bytes", "body_too_large")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise EndpointError(400, f"the body is not JSON: {error}", "invalid_json") from None
    if not isinstance(body, dict):
        raise EndpointError(400, "the body must be a JSON object", "invalid_body")
    return body


def _session_key(request: Request, body: dict[str, Any], guard: Guard) -> str | None:
    header = request.headers.get("x-session-id")
    if header:
        return header
    authorization = request.headers.get("authorization", "")
    bearer = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
    if bearer and guard.token is not None and guard.matches(bearer):
        bearer = bearer[len(guard.token) + 1 :]  # TOKEN:SESSION (or the token alone)
    if bearer:
        return bearer
    user = body.get("user")
    return user if isinstance(user, str) and user else None


async def _events(answer: dict[str, Any]) -> AsyncIterator[bytes]:
    """The answer as OpenAI's stream of `chat.completion.chunk` events."""
    choice = answer["choices"][0]
    message = choice["message"]
    head = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer.get("created", int(time.time())),
        "model": answer["model"],
    }

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    yield event({"role": "assistant", "content": ""})
    if message.get("reasoning_content"):
        yield event({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        yield event({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield event({"tool_calls": [{"index": index, **call}]})
    yield event({}, choice["finish_reason"])
    yield b"data: [DONE]\n\n"
