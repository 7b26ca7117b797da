"""MCP client sessions for synchronous and asynchronous callers.

The `mcp` SDK is async (anyio): a session's transport lives in a task group that must be
entered and left by the same task. `MCPSession` keeps each session in a task of its own on
one event loop that runs in a daemon thread (shared by every session of the process), and
hands calls to that loop: `call` blocks the calling thread, `acall` awaits from any other
event loop. So a `Stepper` can drive an MCP server from `step` and `astep` alike, and a
call's timeout (`astep`'s) cancels the request on the server's loop.

    server = "http://127.0.0.1:8000/mcp"            # streamable HTTP, or
    server = ["python", "my_server.py"]             # a command: a stdio subprocess
    with MCPSession(server) as session:
        session.call("add", {"a": 1, "b": 2})       # an mcp CallToolResult
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import shlex
import sys
import threading
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

Server = str | Sequence[str]
"""An MCP server: a URL (`http://` or `https://`: streamable HTTP) or a command (a string
split like a shell line, or a list of argv) run as a stdio subprocess."""


def is_url(server: Server) -> bool:
    """Whether `server` names a streamable HTTP endpoint rather than a command."""
    return isinstance(server, str) and server.startswith(("http://", "https://"))


def server_argv(server: Server) -> list[str]:
    """A command server's argv (a string is split as a shell would split it)."""
    argv = shlex.split(server) if isinstance(server, str) else [str(part) for part in server]
    if not argv:
        raise ValueError("an MCP server command cannot be empty")
    return argv


def require_sdk() -> None:
    """ImportError naming what to install unless the `mcp` SDK 2.x (its `Client`) is here."""
    try:
        from mcp import Client  # noqa: F401
    except ImportError:
        from importlib import metadata

        try:
            found = f"mcp {metadata.version('mcp')} is installed"
        except metadata.PackageNotFoundError:
            found = "mcp is not installed"
        raise ImportError(
            f"toolgym's MCP support needs the mcp SDK 2.x ({found}): pip install 'mcp>=2.3'"
        ) from None


class _Loop:
    """The one event loop, in a daemon thread, that every session of this process runs on."""

    lock = threading.Lock()
    loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls.lock:
            if cls.loop is None or cls.loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="toolgym-mcp", daemon=True)
                thread.start()
                if cls.loop is None:  # the first session: none may outlive the interpreter
                    atexit.register(_close_all)
                cls.loop = loop
            return cls.loop


def submit(coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run `coroutine` on the sessions' loop; its future."""
    return asyncio.run_coroutine_threadsafe(coroutine, _Loop.get())


_open: weakref.WeakSet[MCPSession] = weakref.WeakSet()


def _close_all() -> None:  # a session left open must not leave its server process behind
    for session in list(_open):
        session.close()


class MCPSession:
    """One MCP client session (a stdio server's process, or an HTTP session), held open by a
    task on the shared loop until `close`.

    Args:
        server: A URL or a command (`Server`).
        env: Extra environment variables for a command server.
        cwd: A command server's working directory.
        mode: The `mcp.Client` protocol negotiation: "legacy" (the initialize handshake, which
            every server speaks and which gives an HTTP session) or "auto".
        timeout: Seconds to wait for the server to start and answer the handshake.
        errlog: Where a command server's stderr goes (default: this process's stderr).
    """

    def __init__(
        self,
        server: Server,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        mode: str = "legacy",
        timeout: float = 60.0,
        errlog: TextIO | None = None,
    ) -> None:
        self.server = server
        self.client: Any = None
        """The open `mcp.Client` (None before `open` and after `close`)."""
        self.used = False
        """A tool was called in this session (it is no longer fresh)."""
        self._closing: asyncio.Event | None = None
        self._held: concurrent.futures.Future[None] | None = None
        self._options = (dict(env or {}), cwd, mode, errlog)
        self.timeout = timeout

    def open(self) -> MCPSession:
        """Start the server (or the HTTP session) and complete the handshake."""
        if self.client is not None:
            return self
        require_sdk()
        opened: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._held = submit(self._hold(opened))
        try:
            self.client = opened.result(self.timeout)
        except BaseException:
            self.close()
            raise
        _open.add(self)
        return self

    async def _hold(self, opened: concurrent.futures.Future[Any]) -> None:
        """The task that owns the session: opens it, waits for `close`, then leaves it."""
        self._closing = asyncio.Event()
        try:
            from mcp import Client

            async with Client(self._target(), mode=self._options[2]) as client:
                opened.set_result(client)
                await self._closing.wait()
        except BaseException as error:
            if not opened.done():
                opened.set_exception(error)
            if not isinstance(error, Exception):
                raise

    def _target(self) -> Any:
        if is_url(self.server):
            return self.server
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        env, cwd, _, errlog = self._options
        argv = server_argv(self.server)
        parameters = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)
        return stdio_client(parameters, errlog=errlog if errlog is not None else sys.stderr)

    def call(self, name: str, arguments: dict[str, Any], timeout: float | None = None) -> Any:
        """Call a tool and wait for its `CallToolResult` (an `MCPError` for a protocol error;
        past `timeout` seconds the request is cancelled and TimeoutError raised)."""
        self.used = True
        future = submit(self._client().call_tool(name, arguments))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the MCP tool {name} took over {timeout:g} s") from None

    async def acall(self, name: str, arguments: dict[str, Any]) -> Any:
        """`call` for an event loop; cancelling it cancels the request."""
        self.used = True
        return await asyncio.wrap_future(submit(self._client().call_tool(name, arguments)))

    def list_tools(self) -> list[Any]:
        """Every tool the server lists (all pages), as `mcp.types.Tool`."""
        return submit(self._list_tools()).result(self.timeout)

    async def _list_tools(self) -> list[Any]:
        tools, cursor = [], None
        for _ in range(1000):
            page = await self._client().list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    def _client(self) -> Any:
        if self.client is None:
            raise RuntimeError(f"the MCP session with {self.server!r} is not open")
        return self.client

    def close(self) -> None:
        """Leave the session: a stdio server's process ends, an HTTP session is closed."""
        held, closing = self._held, self._closing
        self.client, self._held = None, None
        _open.discard(self)
        if held is None:
            return
        if closing is not None:
            _Loop.get().call_soon_threadsafe(closing.set)
        try:
            held.result(self.timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            held.cancel()
        except Exception:
            pass  # the session failed on the way out; nothing is left to release

    def __enter__(self) -> MCPSession:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
