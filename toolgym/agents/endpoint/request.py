"""What `Endpoint` reads and writes in OpenAI's shape: a request body checked and normalised
for the chat template, and the assistant message a completion answers with.

Every check names its failure (an `EndpointError`, OpenAI's 400 shape) before anything is
generated or recorded, so a bad request changes nothing. `tool_choice` may be `auto`, `none`,
`required` or a named function among the request's tools; the last two are accepted (agent
libraries such as smolagents send `required` on every call) but decoding is not constrained:
the policy is trained on what it sampled, so an answer without a call comes back as content.
A request that sets no `temperature` or `top_p` samples at its session's (`open_session`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from typing import Any

from toolgym.agents.endpoint.app import EndpointError
from toolgym.agents.parsers import ParsedMessage
from toolgym.envs.calls import ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")


def checked(body: Any) -> dict[str, Any]:
    """The request's fields, checked: a named 400 for anything this endpoint cannot honour."""
    if not isinstance(body, dict):
        raise EndpointError(400, "the body must be a JSON object", "invalid_body")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "'messages' must be a non-empty list", "invalid_messages")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise EndpointError(
                400, f"not a chat message: {str(message)[:200]}", "invalid_messages"
            )
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools
    ):
        raise EndpointError(400, "'tools' must be a list of function tools", "invalid_tools")
    if body.get("n", 1) not in (1, None):
        raise EndpointError(400, "only n=1 is supported", "invalid_n")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise EndpointError(400, "'stop' must be a string or a list of strings", "invalid_stop")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    try:
        temperature = _number(body.get("temperature"))
        top_p = _number(body.get("top_p"))
        max_tokens = None if max_tokens is None else int(max_tokens)
    except (TypeError, ValueError) as error:
        message = f"a sampling setting is not a number: {error}"
        raise EndpointError(400, message, "invalid_sampling") from None
    if max_tokens is not None and max_tokens <= 0:
        raise EndpointError(400, "max_tokens must be positive", "invalid_sampling")
    return {
        "messages": [for_template(m) for m in messages],
        "tools": tools,
        "tool_choice": _tool_choice(body.get("tool_choice"), tools),
        "stop": stop,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "stream": bool(body.get("stream")),
    }


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> str:
    """`auto`, `none` or `required` (a named function counts as required)."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return str(choice)
    names = {t["function"].get("name") for t in tools}
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
        and choice["function"].get("name") in names
    ):
        return "required"
    raise EndpointError(
        400,
        f"tool_choice {str(choice)[:200]!r} is not supported (auto, none, required, "
        "or a function among the request's tools)",
        "invalid_tool_choice",
    )


def _number(value: Any) -> float | None:
    """A sampling setting as a float; None where the request leaves it to the session."""
    return None if value is None else float(value)


def for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as toolgym's templates read it: text content (OpenAI's content parts
    joined), tool-call arguments as objects."""
    message = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        message["content"] = "".join(
            part.get("text", "") for part in content if isinstance(part, dict)
        )
    elif content is None:
        message["content"] = ""
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):  # else kept as written
                function["arguments"] = json.loads(arguments or "{}")
        calls.append({**call, "function": function})
    if calls:
        message["tool_calls"] = calls
    else:
        message.pop("tool_calls", None)
    return message


def normal(messages: list[dict[str, Any]]) -> list[Any]:
    """What must match for a request to continue a session's sequence: roles, text, calls
    (names and arguments), tool-call ids and names; not the keys clients add or drop."""
    return [
        (
            m.get("role"),
            (m.get("content") or "").strip() if isinstance(m.get("content"), str) else "",
            [
                (c.get("id"), c["function"].get("name"), c["function"].get("arguments"))
                for c in m.get("tool_calls") or []
            ],
            m.get("tool_call_id"),
        )
        for m in messages
    ]


def reply_message(text: str, parsed: ParsedMessage) -> dict[str, Any]:
    """The assistant message in OpenAI's shape (arguments as JSON text); a malformed call
    leaves the text as content, so the program sees what the model wrote."""
    calls = [c for c in parsed.tool_calls if isinstance(c, ToolCall)]
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.failures or (parsed.tool_calls and not calls):
        message["content"] = text
    if calls:
        message["tool_calls"] = [
            {
                "id": call.id or f"call_{secrets.token_hex(6)}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in calls
        ]
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    return message
