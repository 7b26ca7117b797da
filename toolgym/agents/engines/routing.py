"""Which server takes a request: sticky sessions, least-loaded placement (pure logic).

An episode's requests carry its session key (`GenerationRequest.session`). The first request
of a session goes to the healthy server with the fewest requests in flight; the session's
later requests go to the same server while it is healthy, so its prefix cache holds the
episode's earlier turns. A session whose server was taken out moves to the least-loaded
healthy one and stays there. The router keeps no lock of its own: its owner (`ServerPool`)
calls it under the pool's lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(eq=False)
class ServerState:
    """One server as the router sees it, with the figures it has counted."""

    url: str
    up: bool = False
    """Taking requests: it answered its last request or health probe and holds the current
    weights."""
    version: int = 0
    """The weights version it was last given (0: those it started with)."""
    in_flight: int = 0
    """Requests sent to it and not answered yet."""
    requests: int = 0
    """Requests it answered."""
    failures: int = 0
    """Requests that found it gone (each one was taken elsewhere or ended its episode)."""
    prompt_tokens: int = 0
    """Prompt tokens of the requests it answered."""
    cached_tokens: int | None = None
    """Of those, tokens its prefix cache held, as its answers report them (`usage.
    prompt_tokens_details.cached_tokens`, which vLLM sends when started with
    `--enable-prompt-tokens-details`); None: it never reported any."""

    def figures(self) -> dict[str, int | bool | None]:
        """The counted figures, for logs and benchmarks."""
        return {
            "up": self.up,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "failures": self.failures,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
        }


class Router:
    """Chooses a server for each request.

    Args:
        sticky: Keep a session on the server of its first request (False: every request goes
            to the least-loaded server, as a round-robin balancer would place it).
        max_sessions: Sessions remembered (the least recently used are forgotten: a forgotten
            session is placed again as a new one).
    """

    def __init__(self, sticky: bool = True, max_sessions: int = 65536) -> None:
        self.sticky, self.max_sessions = sticky, max_sessions
        self.servers: list[ServerState] = []
        self._sessions: OrderedDict[str, ServerState] = OrderedDict()
        self._turn = 0  # rotates ties between equally loaded servers

    def add(self, url: str, up: bool = False) -> ServerState:
        """A server to route to (the same URL twice is one server)."""
        url = url.rstrip("/")
        for server in self.servers:
            if server.url == url:
                return server
        server = ServerState(url, up=up)
        self.servers.append(server)
        return server

    def healthy(self) -> list[ServerState]:
        """The servers taking requests, in the order they were added."""
        return [server for server in self.servers if server.up]

    def choose(
        self, session: str | None, exclude: Collection[ServerState] = ()
    ) -> ServerState | None:
        """The server for the next request of `session` (None: no session), counted in flight
        there; None when no healthy server is left outside `exclude`."""
        if session is not None and self.sticky:
            held = self._sessions.get(session)
            if held is not None and held.up and held not in exclude:
                self._sessions.move_to_end(session)
                held.in_flight += 1
                return held
        candidates = [server for server in self.healthy() if server not in exclude]
        if not candidates:
            return None
        self._turn += 1
        count = len(candidates)
        rotated = candidates[self._turn % count :] + candidates[: self._turn % count]
        chosen = min(rotated, key=lambda server: server.in_flight)
        if session is not None and self.sticky:
            self._sessions[session] = chosen
            self._sessions.move_to_end(session)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        chosen.in_flight += 1
        return chosen

    def server_of(self, session: str) -> ServerState | None:
        """The server `session` is held on (None: not placed, or forgotten)."""
        return self._sessions.get(session)

    def done(self, server: ServerState, prompt_tokens: int = 0, cached: int | None = None) -> None:
        """A request answered by `server` (with its prompt and cached token counts)."""
        server.in_flight -= 1
        server.requests += 1
        server.prompt_tokens += prompt_tokens
        if cached is not None:
            server.cached_tokens = (server.cached_tokens or 0) + cached

    def failed(self, server: ServerState) -> None:
        """A request that found `server` gone: it is taken out until it answers again."""
        server.in_flight -= 1
        server.failures += 1
        server.up = False
