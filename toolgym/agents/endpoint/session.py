"""The per-session record of `Endpoint`: what one agent program's episode sampled and saw.

A `Session` holds its samples (prompt ids, then sampled ids with mask 1 and the engine's
logprobs, and tool results joined with mask 0), the last conversation, the counts the limits
read, and the status. `continuation` is the one place that decides whether a request extends
the previous call's sequence (the sampled ids kept as sampled, never re-rendered); `Sessions`
is the table of keys: where any key opens a session (`toolgym endpoint`), at most
`max_sessions` exist (a new key past them is refused with 429, no live session is dropped for
it) and one idle past `idle_timeout` seconds is forgotten (a later request with its key starts
a new record), so memory does not grow with every key a client invents.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from toolgym.agents.chat import ChatRenderer, TemplateError
from toolgym.agents.endpoint.app import EndpointError
from toolgym.agents.endpoint.request import for_template, normal
from toolgym.agents.engines.base import Completion
from toolgym.agents.trajectory import Sample, Status, Trajectory


@dataclass
class Session:
    """What one session (one episode of an agent program) produced, call by call."""

    samples: list[Sample] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The last request's conversation and the answer to it."""
    status: Status = "finished"
    error: str | None = None
    calls: int = 0
    tool_calls: int = 0
    """Tool calls the model's answers held (the program runs them; their outcome is its own)."""
    joined: int = 0
    """Calls whose prompt extended the previous call's sequence (no re-rendering)."""
    tokens: int = 0
    """Tokens counted against `max_episode_tokens` (sampled, and tool results joined)."""
    last_request: list[dict[str, Any]] = field(default_factory=list)
    last_reply: dict[str, Any] | None = None
    last_token: int | None = None
    tools_key: str = ""
    temperature: float = 1.0
    """What a request that sets no temperature samples at (the episode's own setting)."""
    top_p: float = 1.0
    calling: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One call at a time per session: its sequence is one history."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards the record while `trajectory` reads it from another thread."""
    used: float = field(default_factory=time.monotonic)
    """When a request last started or ended (what the idle timeout counts from)."""
    by_use: bool = False
    """Opened by a request naming a new key (it may expire), not by `Sessions.open`."""

    def continuation(
        self, renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[list[int], list[int]] | None:
        """(the prompt as the last sample's own ids plus the new tool results' ids, those
        observation ids) where the request is the last conversation, the assistant turn
        answered, then tool results; None where it starts a new sample."""
        before = len(self.last_request)
        if (
            self.last_reply is None
            or renderer.profile.per_turn
            or json.dumps(tools, sort_keys=True) != self.tools_key
            or len(messages) <= before + 1
            or normal(messages[:before]) != normal(self.last_request)
            or normal([messages[before]]) != normal([self.last_reply])
            or any(m.get("role") != "tool" for m in messages[before + 1 :])
        ):
            return None
        after_call_end = self.last_token == renderer.profile.call_end_id
        try:
            suffix = renderer.tool_suffix_ids(messages[before + 1 :], tools, after_call_end)
        except TemplateError:
            return None
        profile = renderer.profile
        ended = self.last_token in (profile.end_of_turn_id, profile.call_end_id)
        closing = [] if ended else [profile.end_of_turn_id]  # the model stopped on end-of-text
        sample = self.samples[-1]
        observation = closing + suffix
        return sample.prompt_ids + sample.completion_ids + observation, observation

    def record(
        self,
        request: dict[str, Any],
        prompt_ids: list[int],
        observation: list[int],
        completion: Completion,
        reply: dict[str, Any],
    ) -> None:
        """Add one call: joined to the last sample where `observation` says it extends it."""
        if observation:
            sample = self.samples[-1]
            sample.append(observation, sampled=False)
            self.joined += 1
            self.tokens += len(observation)
        else:
            sample = Sample(list(prompt_ids))
            self.samples.append(sample)
        sample.append(
            list(completion.token_ids),
            True,
            list(completion.logprobs),
            list(completion.versions) or None,
        )
        self.calls += 1
        self.tool_calls += len(reply.get("tool_calls") or [])
        self.tokens += len(completion.token_ids)
        self.last_request = list(request["messages"])
        self.last_reply = for_template(reply)  # as the program will send it back
        self.last_token = completion.token_ids[-1] if completion.token_ids else None
        self.tools_key = json.dumps(request["tools"], sort_keys=True)
        self.messages = [*request["messages"], reply]
        if completion.finish_reason == "length":
            self.status = "length"

    def trajectory(self) -> Trajectory:
        """The record as a `Trajectory` (copies: the session may go on)."""
        with self.lock:
            samples = [
                Sample(
                    list(s.prompt_ids), list(s.completion_ids), list(s.loss_mask), list(s.logprobs)
                )
                for s in self.samples
            ]
            trajectory = Trajectory(
                samples=samples or [Sample([])],
                messages=list(self.messages),
                status=self.status,
                error=self.error,
            )
            trajectory.metrics = {
                "turns": float(self.calls),
                "joined_calls": float(self.joined),
                "model_tokens": float(trajectory.model_tokens),
                "tool_calls": float(self.tool_calls),
                "tool_failures": 0.0,
            }
            return trajectory


class Sessions:
    """The endpoint's sessions by key: keys it made, or any key where `open_sessions` (at most
    `max_sessions` at once, each forgotten after `idle_timeout` idle seconds; None: no bound)."""

    def __init__(
        self,
        open_sessions: bool = False,
        max_sessions: int | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.open_sessions = open_sessions
        self.max_sessions, self.idle_timeout = max_sessions, idle_timeout
        self.by_key: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, temperature: float = 1.0, top_p: float = 1.0) -> str:
        """A new session's key (the program passes it as its API key); requests that set no
        temperature or top-p sample at these."""
        key = "tg-" + secrets.token_hex(16)
        with self._lock:
            self.by_key[key] = Session(temperature=temperature, top_p=top_p)
        return key

    def get(self, key: str | None) -> Session:
        """The session of `key`; a 401 in OpenAI's shape for a key this endpoint does not know,
        a 429 for a new key past `max_sessions`."""
        with self._lock:
            if key is not None and key in self.by_key:
                session = self.by_key[key]
                session.used = time.monotonic()
                return session
            if key and self.open_sessions:
                self._forget_idle()
                if self.max_sessions is not None and len(self.by_key) >= self.max_sessions:
                    raise EndpointError(429, self._full(), "too_many_sessions", "rate_limit_error")
                return self.by_key.setdefault(key, Session(by_use=True))
        raise EndpointError(
            401,
            "unknown session: pass a key from Endpoint.open_session() as the API key",
            "unknown_session",
            "authentication_error",
        )

    def _forget_idle(self) -> None:
        """Drop the sessions opened by use that are idle past the timeout (none mid-call)."""
        if self.idle_timeout is None:
            return
        now = time.monotonic()
        for key, session in list(self.by_key.items()):
            idle = now - session.used > self.idle_timeout
            if session.by_use and idle and not session.calling.locked():
                del self.by_key[key]

    def _full(self) -> str:
        idle = (
            f"; idle ones are forgotten after {self.idle_timeout:g} s" if self.idle_timeout else ""
        )
        return (
            f"the endpoint holds its {self.max_sessions} sessions (--max-sessions){idle}: a new "
            "key is refused while they last (no live session is dropped for it); reuse a key, "
            "retry later, or raise --max-sessions"
        )

    def close(self, key: str) -> Trajectory:
        """The session's trajectory; the key is refused from then on."""
        trajectory = self.get(key).trajectory()
        with self._lock:
            self.by_key.pop(key, None)
        return trajectory
