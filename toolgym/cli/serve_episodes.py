"""The environment instances `toolgym serve --protocol mcp` keeps, one per MCP session.

An instance is made at its session's first tool call and closed when the client ends the
session, when it has been idle past `--session-idle-timeout`, or when the server stops. At most
`--max-sessions` exist: a newcomer past them is refused (`SessionRefused`, which the server
answers as an error result naming the flag); no live episode is ever closed to make room. A
call on a session whose episode expired is refused too, never answered by a fresh episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from toolgym.cli.env_spec import ResolvedEnv
from toolgym.cli.errors import CLIError
from toolgym.cli.listening import full_message, refuse_unsandboxed

EXPIRED_KEPT = 4096
"""How many expired session ids are remembered (to refuse their calls by name)."""


class SessionRefused(Exception):
    """A session that cannot have an episode now: the server is full, or its episode expired."""


@dataclass
class Episode:
    """One session's instance, the lock its calls take, and when it was last used."""

    env: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    used: float = field(default_factory=time.monotonic)


class Episodes:
    """The sessions' instances (see the module docstring).

    Args:
        resolved: The environment served.
        sandbox: Where each instance runs (`--sandbox`).
        max_sessions: Instances at once.
        idle_timeout: Seconds an instance may stay idle (None: forever, as over stdio).
    """

    def __init__(
        self,
        resolved: ResolvedEnv,
        sandbox: str | None,
        max_sessions: int,
        idle_timeout: float | None = None,
    ) -> None:
        self.resolved, self.sandbox = resolved, sandbox
        self.max_sessions, self.idle_timeout = max_sessions, idle_timeout
        self.instances: dict[str, Episode] = {}
        self._making: dict[str, asyncio.Future[Episode]] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()
        probe = self._make()  # the tools, listed without a session (and checked now)
        try:
            refuse_unsandboxed(probe, resolved.spec)
            self.tools: list[dict[str, Any]] = probe.tools
        finally:
            probe.close()

    def _make(self) -> Any:
        try:
            return self.resolved.make(sandbox=self.sandbox)
        except CLIError:
            raise
        except Exception as error:
            raise CLIError(f"{self.resolved.spec}: {type(error).__name__}: {error}") from None

    async def get(self, key: str) -> Episode:
        """The session's episode, made on first use; `SessionRefused` past `max_sessions` or
        after the session's episode expired."""
        episode = self.instances.get(key)
        if episode is not None:
            episode.used = time.monotonic()
            return episode
        if key in self._making:
            return await asyncio.shield(self._making[key])
        if key in self._expired:
            raise SessionRefused(
                f"this session's episode was closed after {self.idle_timeout:g} s idle "
                "(--session-idle-timeout): open a new session"
            )
        if len(self.instances) + len(self._making) >= self.max_sessions:
            await self.reap()
            if len(self.instances) + len(self._making) >= self.max_sessions:
                raise SessionRefused(
                    full_message("toolgym serve", self.max_sessions, self.idle_timeout)
                )
        making = self._making[key] = asyncio.get_running_loop().create_future()
        try:
            episode = Episode(await asyncio.to_thread(self._make))
        except BaseException as error:
            making.set_exception(error)
            making.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
            del self._making[key]
        self.instances[key] = episode
        making.set_result(episode)
        return episode

    async def end(self, key: str) -> None:
        """Close the episode of a session its client ended."""
        episode = self.instances.pop(key, None)
        if episode is not None:
            async with episode.lock:  # a call in flight finishes first
                await asyncio.to_thread(_close, episode.env)

    async def reap(self) -> int:
        """Close the episodes idle past `idle_timeout` (none with a call in flight); how many."""
        if self.idle_timeout is None:
            return 0
        now = time.monotonic()
        stale = [
            key
            for key, episode in self.instances.items()
            if now - episode.used > self.idle_timeout and not episode.lock.locked()
        ]
        for key in stale:
            episode = self.instances.pop(key)
            self._expired[key] = None
            while len(self._expired) > EXPIRED_KEPT:
                self._expired.popitem(last=False)
            await asyncio.to_thread(_close, episode.env)
        return len(stale)

    async def reap_forever(self) -> None:
        """`reap` every quarter of the idle timeout (at most every 30 s), until cancelled."""
        if self.idle_timeout is None:
            return
        while True:
            await asyncio.sleep(min(self.idle_timeout / 4, 30.0))
            await self.reap()

    def close(self) -> None:
        """Close every session's instance."""
        while self.instances:
            _, episode = self.instances.popitem()
            _close(episode.env)


def _close(env: Any) -> None:
    with contextlib.suppress(Exception):
        env.close()
