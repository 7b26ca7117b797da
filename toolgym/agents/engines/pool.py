"""`ServerPool`: several inference servers behind one engine, one policy at a time.

Each request goes to the server the `Router` picks (sticky sessions, least-loaded new ones).
A server that cannot be reached, or fails on its side (HTTP 5xx), is taken out and the request
is sent again to another one: requests are not streamed, so a lost request has returned no
token and its completion is made whole elsewhere, under the same weights. A request ends with
`ServerError` (its episode with `engine_error`) when no server is left to take it within
`wait_for_server` seconds, or after `retries` servers failed it. A health probe puts a server
back when it answers again, after giving it the current weights.

A weight update waits for the requests in flight (they finish under the old weights, on
whichever server holds them), holds back new ones, gives every healthy server the new weights
and only then lets the held requests go: no completion mixes two policies, and no request
reaches a server whose weights are behind. A server that joins later (`add`, or one coming
back) gets the current weights before its first request.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from toolgym.agents.engines.routing import Router, ServerState

T = TypeVar("T")


class ServerError(RuntimeError):
    """The server answered with an error or could not be reached."""


class ServerGone(ServerError):
    """The server could not be reached or failed on its side: another one may take the
    request."""


def call_json(
    url: str, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 600.0
) -> Any:
    """`method url+path` with a JSON body; the decoded JSON answer (None when empty)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        error.close()
        hint = (
            " (start the server with VLLM_SERVER_DEV_MODE=1)"
            if path == "/collective_rpc" and error.code == 404
            else ""
        )
        kind = ServerGone if error.code >= 500 else ServerError
        raise kind(f"{method} {url}{path} -> HTTP {error.code}: {detail}{hint}") from None
    except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out
        raise ServerGone(f"{method} {path}: cannot reach {url}: {error!r}") from None
    return json.loads(payload) if payload else None


Answer = tuple[T, int, int | None]
"""What a request's `send(url)` returns: its result, its prompt tokens, and the tokens the
server's prefix cache held (None: not reported)."""


class ServerPool:
    """Servers, their health, and the gate between requests and weight updates.

    Args:
        urls: The servers' base URLs (a router in front of several counts as one).
        sync: Gives one server (its URL) the current weights; raises `ServerError`.
        sticky: Keep a session on one server (see `Router`).
        probe_interval: Seconds between health probes of the servers taken out.
        probe_timeout: Seconds a probe waits for `/health`.
        wait_for_server: Seconds a request waits for a healthy server when none is left.
        retries: Servers a request is sent to again after the one it was on failed.
    """

    def __init__(
        self,
        urls: Sequence[str],
        sync: Callable[[str], None],
        sticky: bool = True,
        probe_interval: float = 1.0,
        probe_timeout: float = 2.0,
        wait_for_server: float = 30.0,
        retries: int = 2,
    ) -> None:
        self.router = Router(sticky=sticky)
        self._sync = sync
        self.probe_timeout, self.wait_for_server, self.retries = (
            probe_timeout,
            wait_for_server,
            retries,
        )
        self.version = 0
        """The current weights' version (0: those the servers started with)."""
        self._cond = threading.Condition()  # router state, requests in flight vs an update
        self._weights = threading.Lock()  # one change of weights at a time (update or rejoin)
        self._updating = False
        self._in_flight = 0
        for url in urls:
            self.add(url)
        self._stop = threading.Event()
        self._prober = threading.Thread(
            target=self._probe_loop, args=(probe_interval,), name="server-probe", daemon=True
        )
        self._prober.start()

    @property
    def servers(self) -> list[ServerState]:
        """Every server, up or not, in the order added."""
        with self._cond:
            return list(self.router.servers)

    @property
    def updating(self) -> bool:
        """A weight update is under way (new requests wait for it)."""
        return self._updating

    def add(self, url: str) -> ServerState:
        """Route to `url` from now on; it takes requests once it answers and holds the
        current weights (at once if it does now, else when a probe finds it)."""
        with self._cond:
            server = self.router.add(url)
        self._rejoin(server)
        return server

    def run(self, session: str | None, send: Callable[[str], Answer[T]]) -> T:
        """`send(url)` on the server for `session`; on another one if that one is gone."""
        with self._cond:
            while self._updating:
                self._cond.wait()
            self._in_flight += 1
        try:
            return self._attempts(session, send)
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def _attempts(self, session: str | None, send: Callable[[str], Answer[T]]) -> T:
        failures: list[str] = []
        while len(failures) <= self.retries:
            server = self._acquire(session)
            try:
                result, prompt_tokens, cached = send(server.url)
            except ServerGone as error:
                with self._cond:
                    self.router.failed(server)
                failures.append(str(error))
                continue
            except BaseException:
                with self._cond:
                    server.in_flight -= 1
                raise
            with self._cond:
                self.router.done(server, prompt_tokens, cached)
            return result
        raise ServerError(f"{len(failures)} servers failed the request: {'; '.join(failures)}")

    def _acquire(self, session: str | None) -> ServerState:
        deadline = time.monotonic() + self.wait_for_server
        with self._cond:
            while (server := self.router.choose(session)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    urls = ", ".join(s.url for s in self.router.servers)
                    raise ServerError(
                        f"no server answers ({urls}) after {self.wait_for_server:g} s"
                    )
                self._cond.wait(min(left, 1.0))
            return server

    def update(self, write: Callable[[], None]) -> None:
        """Change the weights: wait for the requests in flight, hold back new ones, `write()`
        the new weights where `sync` reads them, sync every healthy server, let requests go.
        A server that fails its sync is taken out (it gets the weights when it is back)."""
        with self._cond:
            while self._updating:
                self._cond.wait()
            self._updating = True
            while self._in_flight:
                self._cond.wait()
        try:
            with self._weights:
                write()
                self.version += 1
                with self._cond:
                    targets = self.router.healthy()
                with ThreadPoolExecutor(max(1, len(targets))) as threads:
                    outcomes = list(threads.map(self._sync_one, targets))
            refused = [error for error in outcomes if error is not None]
            if refused:
                raise refused[0]
        finally:
            with self._cond:
                self._updating = False
                self._cond.notify_all()

    def _sync_one(self, server: ServerState) -> ServerError | None:
        """Sync one server (under `_weights`); gone: taken out; refused: the error."""
        try:
            self._sync(server.url)
        except ServerError as error:
            with self._cond:
                server.up = False
            return None if isinstance(error, ServerGone) else error
        server.version = self.version
        return None

    def _rejoin(self, server: ServerState) -> bool:
        """Put `server` back if it answers, after giving it the current weights."""
        try:
            call_json(server.url, "GET", "/health", timeout=self.probe_timeout)
        except ServerError:
            return False
        with self._weights:
            if self.version:  # it may have restarted from its first weights: sync it always
                try:
                    self._sync(server.url)
                except ServerError:
                    return False
                server.version = self.version
            with self._cond:
                server.up = True
                self._cond.notify_all()
        return True

    def _probe_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for server in self.servers:
                if not server.up and not self._stop.is_set():
                    self._rejoin(server)

    def close(self) -> None:
        """Stop probing (the servers keep running)."""
        self._stop.set()
        self._prober.join(timeout=self.probe_timeout + 1)
