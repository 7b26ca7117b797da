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

Each synced server is told the weights' version (vLLM's `/update_weight_version`); the probe
asks idle servers for theirs (`/weight_info`), so a server that restarted between two probes
(back on its first weights, version "default") is taken out and synced again. Several trainer
processes sharing servers have one pool each: the main process's syncs them, the others
`advance` and let a server in only once it reports the current version.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from toolgym.agents.engines.http_json import Connected, ServerError, ServerGone, call_json, cut
from toolgym.agents.engines.routing import Router, ServerState
from toolgym.agents.engines.weight_version import label, reported_version, tag

__all__ = ["Answer", "ServerError", "ServerGone", "ServerPool", "call_json"]

T = TypeVar("T")


Answer = tuple[T, int, int | None]
"""What a request's `send(url, connected)` returns: its result, its prompt tokens, and the
tokens the server's prefix cache held (None: not reported)."""

Send = Callable[[str, Connected], Answer[T]]
"""A request on one server (its URL), telling `connected` of its connection."""


class ServerPool:
    """Servers, their health, and the gate between requests and weight updates.

    Args:
        urls: The servers' base URLs (a router in front of several counts as one).
        sync: Gives one server (its URL) the current weights; raises `ServerError`.
        forget: Told a server's URL before it is synced to rejoin (what linked it to the
            weights is stale: a server that comes back may have restarted).
        sticky: Keep a session on one server (see `Router`).
        probe_interval: Seconds between health probes of the servers taken out and of those
            with requests in flight.
        probe_timeout: Seconds a probe waits for `/health`; a server with requests in flight
            that misses two probes in a row is taken out and its requests sent on.
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
        forget: Callable[[str], None] | None = None,
    ) -> None:
        self.router = Router(sticky=sticky)
        self._sync = sync
        self._forget = forget or (lambda url: None)
        self.probe_timeout, self.wait_for_server, self.retries = (
            probe_timeout,
            wait_for_server,
            retries,
        )
        self.version = 0
        """The current weights' version (0: those the servers started with)."""
        self.leads = True
        """This pool syncs the servers (False after `advance`: another process's pool does)."""
        self._cond = threading.Condition()  # router state, requests in flight vs an update
        self._weights = threading.Lock()  # one change of weights at a time (update or rejoin)
        self._updating = False
        self._in_flight = 0
        self._connections: dict[ServerState, set[http.client.HTTPConnection]] = {}
        self._misses: dict[ServerState, int] = {}  # health probes missed in a row
        self.misses_to_cut = 2
        """Probes a busy server may miss in a row before its requests are cut and sent on."""
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

    def run(self, session: str | None, send: Send[T]) -> T:
        """`send(url, connected)` on the server for `session`; on another one if that one is
        gone (it failed the request, or stopped answering health probes while it ran)."""
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

    def _attempts(self, session: str | None, send: Send[T]) -> T:
        failures: list[str] = []
        while len(failures) <= self.retries:
            server = self._acquire(session)
            try:
                result, prompt_tokens, cached = self._send_on(server, send)
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

    def _send_on(self, server: ServerState, send: Send[T]) -> Answer[T]:
        """`send` on `server`, its connection known to the watch (cut if the server hangs)."""
        opened: list[http.client.HTTPConnection] = []

        def connected(connection: http.client.HTTPConnection) -> None:
            with self._cond:
                opened.append(connection)
                self._connections.setdefault(server, set()).add(connection)

        try:
            return send(server.url, connected)
        finally:
            with self._cond:
                self._connections.get(server, set()).difference_update(opened)

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

    def advance(self) -> None:
        """Another process's pool gave every server the next weights: count them, and from now
        on let a server (back) in only once it reports this version; never sync from here."""
        with self._weights:
            self.leads = False
            self.version += 1
            with self._cond:
                for server in self.router.servers:
                    server.version = self.version

    def _sync_one(self, server: ServerState) -> ServerError | None:
        """Sync one server (under `_weights`); gone: taken out; refused: the error."""
        try:
            self._sync(server.url)
        except ServerError as error:
            with self._cond:
                server.up = False
            return None if isinstance(error, ServerGone) else error
        server.version = self.version
        tag(server.url, label(self.version), self.probe_timeout)
        return None

    def _rejoin(self, server: ServerState) -> bool:
        """Put `server` back if it answers, after giving it the current weights."""
        try:
            call_json(server.url, "GET", "/health", timeout=self.probe_timeout)
        except ServerError:
            return False
        with self._weights:
            if self.version and not self.leads:  # the leading pool syncs it
                if reported_version(server.url, self.probe_timeout) != label(self.version):
                    return False
            elif self.version:  # it may have restarted from its first weights: sync it always
                try:
                    self._forget(server.url)
                    self._sync(server.url)
                except ServerError:
                    return False
                tag(server.url, label(self.version), self.probe_timeout)
            server.version = self.version
            with self._cond:
                server.up = True
                self._cond.notify_all()
        return True

    def _probe_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for server in self.servers:
                if self._stop.is_set():
                    break
                if not server.up:
                    self._rejoin(server)
                elif server.in_flight:
                    self._watch(server)
                else:
                    self._check_version(server)

    def _check_version(self, server: ServerState) -> None:
        """Take out an idle server that reports other weights than the current ones (it
        restarted unseen); servers that report no version are not checked."""
        if not self.version or not self._weights.acquire(blocking=False):
            return  # the servers' first weights, or an update or rejoin under way
        try:
            found = reported_version(server.url, self.probe_timeout)
            if found is not None and found != label(self.version):
                with self._cond:
                    server.up = False
        finally:
            self._weights.release()

    def _watch(self, server: ServerState) -> None:
        """Probe a server with requests in flight; one that misses `misses_to_cut` probes in a
        row hangs: take it out and cut its requests' connections (they go to another one)."""
        try:
            call_json(server.url, "GET", "/health", timeout=self.probe_timeout)
        except ServerError:
            self._misses[server] = self._misses.get(server, 0) + 1
        else:
            self._misses[server] = 0
        if self._misses[server] < self.misses_to_cut:
            return
        self._misses[server] = 0
        with self._cond:
            server.up = False
            hung = list(self._connections.get(server, ()))
        for connection in hung:
            cut(connection)

    def close(self) -> None:
        """Stop probing (the servers keep running)."""
        self._stop.set()
        self._prober.join(timeout=self.probe_timeout + 1)
