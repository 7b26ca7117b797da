"""An OpenAI-compatible chat endpoint that records exact tokens: train an agent program as it is.

    with Endpoint(engine, tokenizer) as endpoint:          # http://127.0.0.1:<port>/v1
        key = endpoint.open_session()                        # one per episode
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=key)
        ...                                                  # the program's own tool loop
        trajectory = endpoint.trajectory(key)                # ids, masks, logprobs, messages

`POST /v1/chat/completions` (tools, `tool_choice` auto/none/required/a named function (the last
two unconstrained: the policy trains on what it sampled), temperature, top_p (unset: the
session's), max_tokens, stop, `n=1`, `stream`) and `GET /v1/models`, on loopback by default.
A request renders through the model's chat template (`ChatRenderer`), generates on the engine
(per request where the engine can, else in batches), and answers with the parsed `content`,
`tool_calls` and `reasoning_content`, in OpenAI's shape.

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

Who may call it: the `Guard` of `toolgym.http_guard` (loopback by default; its own Host
header, no foreign Origin, JSON bodies only; beyond loopback a token). Where any key opens a
session (`open_sessions`), `max_sessions` bounds them and `session_idle_timeout` forgets idle
ones (`Sessions`).

The request checks and OpenAI's message shapes live in `request.py`, the
per-session record (and the joining rule) in `session.py`, the HTTP routes in
`app.py`.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Any, cast

from toolgym.agents.chat import ChatRenderer
from toolgym.agents.endpoint.app import EndpointError, build_app
from toolgym.agents.endpoint.request import checked, reply_message
from toolgym.agents.endpoint.session import Session, Sessions
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
from toolgym.agents.trajectory import Status, Trajectory
from toolgym.http_guard import Guard, is_loopback

__all__ = ["Endpoint", "EndpointError", "Session"]


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
        token: The token every request must carry (needed beyond loopback with
            `open_sessions`; see `toolgym.http_guard` for where it travels).
        max_sessions: With `open_sessions`: sessions at once (a new key past them gets 429).
        session_idle_timeout: With `open_sessions`: seconds after which an idle session
            opened by a request is forgotten.
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
        token: str | None = None,
        max_sessions: int | None = None,
        session_idle_timeout: float | None = None,
    ) -> None:
        if open_sessions and token is None and not is_loopback(host):
            raise ValueError(
                f"an endpoint open to any session key on {host} (beyond loopback) needs a token"
            )
        self.guard = Guard(host, token)
        self.engine, self.tokenizer = engine, tokenizer
        self.limits = limits or AgentLimits()
        self.host, self.port, self.model_name = host, port, model_name
        self.open_sessions = open_sessions
        kwargs = chat_template_kwargs or {}
        self.renderer = ChatRenderer(tokenizer, chat_template, None, **kwargs)
        template = {"chat_template": chat_template} if chat_template else {}
        self.parse: Parser = get_parser(parser, tokenizer, **template, **kwargs)
        self._sessions = Sessions(open_sessions, max_sessions, session_idle_timeout)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._generate_lock = threading.Lock()

    # -- sessions ------------------------------------------------------------------------------
    @property
    def sessions(self) -> dict[str, Session]:
        """The open sessions by key."""
        return self._sessions.by_key

    def open_session(self, temperature: float = 1.0, top_p: float = 1.0) -> str:
        """A new session's key (pass it as the API key); a request that sets no temperature or
        top-p samples at these (`program_rollout` passes the episode's: greedy in a greedy
        evaluation)."""
        return self._sessions.open(temperature, top_p)

    def trajectory(self, key: str) -> Trajectory:
        """What the session recorded, as a `Trajectory`: one sample per sequence (calls that
        joined share one), masks 1 on sampled tokens, the engine's logprobs, the last
        conversation, and the status (`max_turns` / `length` where a limit refused a call)."""
        return self._sessions.get(key).trajectory()

    def close_session(self, key: str) -> Trajectory:
        """The session's trajectory; the key is refused from then on."""
        return self._sessions.close(key)

    # -- one chat completion ---------------------------------------------------------------
    async def complete(self, key: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one `/v1/chat/completions` body for session `key` (OpenAI's shape)."""
        request = checked(body)
        session = self._sessions.get(key)
        async with session.calling:
            prompt_ids, observation = self._prompt(session, request)
            sampling = self._sampling(session, request, prompt_ids, observation)
            try:
                generation = GenerationRequest(prompt_ids, sampling, session=key)
                completion = await self._generate(generation)
            except EndpointError as error:  # the engine's failure: the session says so
                session.status, session.error = "engine_error", error.message
                raise
            text = self._decode(completion)
            parsed = await asyncio.to_thread(self._parsed, text, request)  # off the loop
            reply = reply_message(text, parsed)
            with session.lock:
                session.record(request, prompt_ids, observation, completion, reply)
            session.used = time.monotonic()
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
        joined = session.continuation(self.renderer, messages, tools)
        if joined is not None:
            return joined
        try:
            return self.renderer.prompt_ids(messages, tools), []
        except Exception as error:
            message = f"the chat template cannot render: {error}"
            raise EndpointError(400, message, "bad_messages") from error

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
            temperature=_either(request["temperature"], session.temperature),
            top_p=_either(request["top_p"], session.top_p),
            stop_token_ids=list(self.renderer.profile.stop_token_ids),
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
        stops = self.renderer.profile.stop_token_ids
        if completion.finish_reason == "stop" and ids and ids[-1] in stops:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _parsed(self, text: str, request: dict[str, Any]) -> ParsedMessage:
        if not request["tools"] or request["tool_choice"] == "none":
            return ParsedMessage(text.strip())
        try:
            return type_arguments(self.parse(text), request["tools"])
        except Exception:  # a user's parser that raises: the text as it is
            return ParsedMessage(text.strip())

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
            build_app(self, self.guard),
            host=self.host,
            port=self.port,
            log_level="warning",
            lifespan="off",
        )
        self._server = server = uvicorn.Server(config)
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                server.run()
            except BaseException as error:  # reported by start(), not lost with the thread
                failure.append(error)

        self._thread = threading.Thread(  # daemon: an endpoint nobody closed never holds exit
            target=serve, name="toolgym-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                why = f": {failure[0]!r}" if failure else " (the server stopped before it began)"
                if self._thread.is_alive():
                    why = " within 30 s"
                raise RuntimeError(f"the endpoint could not listen on {self.host}:{self.port}{why}")
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


def _either(asked: float | None, default: float) -> float:
    return default if asked is None else asked
