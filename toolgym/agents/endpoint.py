"""An OpenAI-compatible chat endpoint that records exact tokens: train an agent program as it is.

    with Endpoint(engine, tokenizer) as endpoint:          # http://127.0.0.1:<port>/v1
        key = endpoint.open_session()                        # one per episode
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=key)
        ...                                                  # the program's own tool loop
        trajectory = endpoint.trajectory(key)                # ids, masks, logprobs, messages

`POST /v1/chat/completions` (tools, `tool_choice` auto/none, temperature, top_p, max_tokens,
stop, `n=1`, `stream`) and `GET /v1/models`, on loopback by default. A request renders through
the model's chat template (`ChatRenderer`), generates on the engine (per request where the
engine can, else in batches), and answers with the parsed `content`, `tool_calls` and
`reasoning_content`, in OpenAI's shape.

Exactness: each session (its API key; `X-Session-Id` or the `user` field name another) records
every call's prompt ids, sampled ids and logprobs. When a request repeats the previous call's
conversation, then the assistant turn this endpoint answered, then tool results, the tokens
the model sampled are kept as they were (never re-rendered) and the tool results are appended
as the ids the template writes after an assistant turn (mask 0): the calls join into one
sequence, as toolgym's own chat loop builds it. Any other request (a changed history, a
template that is not prefix-preserving) starts a new sample from the template's rendering of
the whole request, which is what the engine then really saw. Limits (`AgentLimits`: turns,
tokens) are enforced per session: a request past them gets an OpenAI-style error, and the
session's status says which (`max_turns`, `length`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast

from toolgym.agents.chat import ChatRenderer, TemplateError
from toolgym.agents.endpoint_app import EndpointError, build_app
from toolgym.agents.engines.base import (
    Completion,
    Engine,
    GenerationRequest,
    PerRequestEngine,
    SamplingParams,
    capabilities,
)
from toolgym.agents.limits import AgentLimits
from toolgym.agents.parsers import ParsedMessage, Parser, get_parser, type_arguments
from toolgym.agents.trajectory import Sample, Status, Trajectory
from toolgym.envs.calls import ToolCall


@dataclass
class Session:
    """What one session (one episode of an agent program) produced, call by call."""

    samples: list[Sample] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The last request's conversation and the answer to it."""
    status: Status = "finished"
    error: str | None = None
    calls: int = 0
    joined: int = 0
    """Calls whose prompt extended the previous call's sequence (no re-rendering)."""
    tokens: int = 0
    """Tokens counted against `max_episode_tokens` (sampled, and tool results joined)."""
    last_request: list[dict[str, Any]] = field(default_factory=list)
    last_reply: dict[str, Any] | None = None
    last_token: int | None = None
    tools_key: str = ""
    calling: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One call at a time per session: its sequence is one history."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards the record while `trajectory` reads it from another thread."""


class Endpoint:
    """The OpenAI-compatible endpoint over an engine (see the module's docstring).

    Args:
        engine: The generation backend (vLLM, a server, transformers, scripted).
        tokenizer: The model's tokenizer, with its chat template.
        parser: The tool-call parser (`"auto"`, a name, or a callable).
        limits: Per-session limits (turns = calls, `max_new_tokens` caps `max_tokens`,
            `max_episode_tokens` counts sampled and joined tokens).
        host, port: Where to listen (port 0: any free port).
        model_name: The name `/v1/models` lists and responses carry.
        open_sessions: Accept any session key, opening it on first use (a standalone
            server); by default only keys from `open_session` are accepted.
        chat_template, chat_template_kwargs: As for `Agent`.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        parser: str | Parser = "auto",
        limits: AgentLimits | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "toolgym",
        open_sessions: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.limits = limits or AgentLimits()
        self.host, self.port, self.model_name = host, port, model_name
        self.open_sessions = open_sessions
        kwargs = chat_template_kwargs or {}
        self.renderer = ChatRenderer(tokenizer, chat_template, None, **kwargs)
        template = {"chat_template": chat_template} if chat_template else {}
        self.parse: Parser = get_parser(parser, tokenizer, **template, **kwargs)
        self.sessions: dict[str, Session] = {}
        self._sessions_lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._generate_lock = threading.Lock()

    # -- sessions ------------------------------------------------------------------------------
    def open_session(self) -> str:
        """A new session's key (pass it as the API key)."""
        key = "tg-" + secrets.token_hex(16)
        with self._sessions_lock:
            self.sessions[key] = Session()
        return key

    def trajectory(self, key: str) -> Trajectory:
        """What the session recorded, as a `Trajectory`: one sample per sequence (calls that
        joined share one), masks 1 on sampled tokens, the engine's logprobs, the last
        conversation, and the status (`max_turns` / `length` where a limit refused a call)."""
        session = self._session(key)
        with session.lock:
            samples = [
                Sample(
                    list(s.prompt_ids), list(s.completion_ids), list(s.loss_mask), list(s.logprobs)
                )
                for s in session.samples
            ]
            trajectory = Trajectory(
                samples=samples or [Sample([])],
                messages=list(session.messages),
                status=session.status,
                error=session.error,
            )
            trajectory.metrics = {
                "turns": float(session.calls),
                "joined_calls": float(session.joined),
                "model_tokens": float(trajectory.model_tokens),
                "tool_calls": 0.0,
                "tool_failures": 0.0,
            }
            return trajectory

    def close_session(self, key: str) -> Trajectory:
        """The session's trajectory; the key is refused from then on."""
        trajectory = self.trajectory(key)
        with self._sessions_lock:
            self.sessions.pop(key, None)
        return trajectory

    def _session(self, key: str | None) -> Session:
        with self._sessions_lock:
            if key is not None and key in self.sessions:
                return self.sessions[key]
            if key and self.open_sessions:
                return self.sessions.setdefault(key, Session())
        raise EndpointError(
            401,
            "unknown session: pass a key from Endpoint.open_session() as the API key",
            "unknown_session",
            "authentication_error",
        )

    # -- one chat completion ---------------------------------------------------------------
    async def complete(self, key: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one `/v1/chat/completions` body for session `key` (OpenAI's shape)."""
        request = _checked(body)
        session = self._session(key)
        async with session.calling:
            prompt_ids, observation = self._prompt(session, request)
            sampling = self._sampling(session, request, prompt_ids, observation)
            completion = await self._generate(GenerationRequest(prompt_ids, sampling))
            text = self._decode(completion)
            parsed = await asyncio.to_thread(self._parsed, text, request)  # off the loop
            reply = _reply_message(text, parsed)
            with session.lock:
                self._record(session, request, prompt_ids, observation, completion, reply)
        finish = "length" if completion.finish_reason == "length" else "stop"
        if reply.get("tool_calls"):
            finish = "tool_calls"
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion.token_ids),
            "total_tokens": len(prompt_ids) + len(completion.token_ids),
        }
        return {
            "id": "chatcmpl-" + secrets.token_hex(12),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
            "usage": usage,
        }

    def _prompt(self, session: Session, request: dict[str, Any]) -> tuple[list[int], list[int]]:
        """(the prompt ids, the observation ids appended to the last sample when the call
        extends it; empty for a new sample)."""
        messages, tools = request["messages"], request["tools"]
        joined = self._joined(session, messages, tools)
        if joined is not None:
            return joined
        try:
            return self.renderer.prompt_ids(messages, tools), []
        except Exception as error:
            message = f"the chat template cannot render: {error}"
            raise EndpointError(400, message, "bad_messages") from error

    def _joined(
        self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[list[int], list[int]] | None:
        """The prompt as the last sample's own ids plus the new tool results' ids, where the
        request is the last conversation, the assistant turn answered, then tool results."""
        before = len(session.last_request)
        if (
            session.last_reply is None
            or self.renderer.per_turn
            or json.dumps(tools, sort_keys=True) != session.tools_key
            or len(messages) <= before + 1
            or _normal(messages[:before]) != _normal(session.last_request)
            or _normal([messages[before]]) != _normal([session.last_reply])
            or any(m.get("role") != "tool" for m in messages[before + 1 :])
        ):
            return None
        renderer = self.renderer
        after_call_end = session.last_token == renderer.call_end_id
        try:
            suffix = renderer.tool_suffix_ids(messages[before + 1 :], tools, after_call_end)
        except TemplateError:
            return None
        closing = (
            []
            if session.last_token in (renderer.end_of_turn_id, renderer.call_end_id)
            else [
                renderer.end_of_turn_id  # the model stopped on end-of-text
            ]
        )
        sample = session.samples[-1]
        observation = closing + suffix
        return sample.prompt_ids + sample.completion_ids + observation, observation

    def _sampling(
        self,
        session: Session,
        request: dict[str, Any],
        prompt_ids: list[int],
        observation: list[int],
    ) -> SamplingParams:
        limits = self.limits
        if session.calls >= limits.max_turns:
            self._refuse(session, "max_turns", f"the session's {limits.max_turns} calls are used")
        room = min(
            limits.max_episode_tokens - session.tokens - len(observation),
            self.engine.context_length - len(prompt_ids),
        )
        if room <= 0:
            self._refuse(session, "length", "the session's token budget is spent")
        asked = request["max_tokens"] or limits.max_new_tokens
        return SamplingParams(
            max_tokens=min(asked, limits.max_new_tokens, room),
            temperature=request["temperature"],
            top_p=request["top_p"],
            stop_token_ids=self.renderer.stop_token_ids,
            stop_strings=request["stop"],
        )

    def _refuse(self, session: Session, status: Status, why: str) -> None:
        session.status, session.error = status, why
        raise EndpointError(400, why, status)

    async def _generate(self, request: GenerationRequest) -> Completion:
        try:
            if capabilities(self.engine).per_request:
                engine = cast(PerRequestEngine, self.engine)
                return await asyncio.wrap_future(engine.submit(request))
            return await asyncio.to_thread(self._generate_one, request)
        except Exception as error:
            message = f"the engine failed: {error}"
            raise EndpointError(500, message, "engine_error", "server_error") from error

    def _generate_one(self, request: GenerationRequest) -> Completion:
        with self._generate_lock:  # engines without submit() take one caller at a time
            return self.engine.generate([request])[0]

    def _decode(self, completion: Completion) -> str:
        ids = completion.token_ids
        if completion.finish_reason == "stop" and ids and ids[-1] in self.renderer.stop_token_ids:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _parsed(self, text: str, request: dict[str, Any]) -> ParsedMessage:
        if not request["tools"] or request["tool_choice"] == "none":
            return ParsedMessage(text.strip())
        try:
            return type_arguments(self.parse(text), request["tools"])
        except Exception:  # a user's parser that raises: the text as it is
            return ParsedMessage(text.strip())

    def _record(
        self,
        session: Session,
        request: dict[str, Any],
        prompt_ids: list[int],
        observation: list[int],
        completion: Completion,
        reply: dict[str, Any],
    ) -> None:
        if observation:
            sample = session.samples[-1]
            sample.append(observation, sampled=False)
            session.joined += 1
            session.tokens += len(observation)
        else:
            sample = Sample(list(prompt_ids))
            session.samples.append(sample)
        sample.append(list(completion.token_ids), True, list(completion.logprobs))
        session.calls += 1
        session.tokens += len(completion.token_ids)
        session.last_request = list(request["messages"])
        session.last_reply = _for_template(reply)  # as the program will send it back
        session.last_token = completion.token_ids[-1] if completion.token_ids else None
        session.tools_key = json.dumps(request["tools"], sort_keys=True)
        session.messages = [*request["messages"], reply]
        if completion.finish_reason == "length":
            session.status = "length"

    # -- the server ----------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """`http://host:port/v1` once started."""
        if self._server is None:
            raise RuntimeError("the endpoint is not started (use `with Endpoint(...)` or start())")
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> str:
        """Serve in a background thread; the base URL."""
        import uvicorn

        config = uvicorn.Config(
            build_app(self), host=self.host, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(  # daemon: an endpoint nobody closed never holds exit
            target=self._server.run, name="toolgym-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint could not listen on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.base_url

    def close(self) -> None:
        """Stop serving (sessions stay readable)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> Endpoint:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Endpoint:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)


def _checked(body: Any) -> dict[str, Any]:
    """The request's fields, checked: a named 400 for anything this endpoint cannot honour."""
    if not isinstance(body, dict):
        raise EndpointError(400, "the body must be a JSON object", "invalid_body")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "'messages' must be a non-empty list", "invalid_messages")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in (
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        ):
            raise EndpointError(
                400, f"not a chat message: {str(message)[:200]}", "invalid_messages"
            )
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools
    ):
        raise EndpointError(400, "'tools' must be a list of function tools", "invalid_tools")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none", None):
        raise EndpointError(
            400, f"tool_choice {choice!r} is not supported (auto or none)", "invalid_tool_choice"
        )
    if body.get("n", 1) != 1:
        raise EndpointError(400, "only n=1 is supported", "invalid_n")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise EndpointError(400, "'stop' must be a string or a list of strings", "invalid_stop")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    try:
        temperature = float(_given(body, "temperature", 1.0))
        top_p = float(_given(body, "top_p", 1.0))
        max_tokens = None if max_tokens is None else int(max_tokens)
    except (TypeError, ValueError) as error:
        message = f"a sampling setting is not a number: {error}"
        raise EndpointError(400, message, "invalid_sampling") from None
    if max_tokens is not None and max_tokens <= 0:
        raise EndpointError(400, "max_tokens must be positive", "invalid_sampling")
    return {
        "messages": [_for_template(m) for m in messages],
        "tools": tools,
        "tool_choice": choice or "auto",
        "stop": stop,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "stream": bool(body.get("stream")),
    }


def _given(body: dict[str, Any], name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
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


def _normal(messages: list[dict[str, Any]]) -> list[Any]:
    """What must match for a request to continue a session's sequence: roles, text, calls
    (names and arguments), tool-call ids and names; not the keys clients add or drop."""
    return [
        (
            m.get("role"),
            (m.get("content") or "").strip(),
            [
                (c.get("id"), c["function"].get("name"), c["function"].get("arguments"))
                for c in m.get("tool_calls") or []
            ],
            m.get("tool_call_id"),
        )
        for m in messages
    ]


def _reply_message(text: str, parsed: ParsedMessage) -> dict[str, Any]:
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
