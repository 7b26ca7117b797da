"""`toolgym serve ENV --protocol mcp [--stdio | --port P]`: an environment as an MCP server.

Any ENV the other commands take (a registered id, `path/to/file.py:Class`, `module:attr`) is
served with the `mcp` SDK's low-level server, one environment instance per MCP session: the
stdio server's one client (a process per client), or each streamable HTTP session
(`Mcp-Session-Id`; a request without one, as the sessionless 2026-07-28 protocol sends over
HTTP, is answered with an error saying to connect with the initialize handshake).

Tools: the environment's own, with their JSON schemas, plus three of toolgym's (names no
environment tool can take):

- `reset(seed=None, **columns)`: starts an episode from a dataset row's columns; its text is
  the first observation. A session's first call of any other tool resets it first, without
  arguments, so a client that knows nothing of episodes still plays one.
- `reward()`: the episode's reward as text (`null`: the environment gives none), and
  `{"reward", "done", "turn"}` as structured content.
- `final_answer(text)`: hands the model's final answer to the environment to grade.

Every tool result also carries `_meta` = `{"toolgym/reward": the step's reward,
"toolgym/done": the episode is over, "toolgym/turn": turns taken}`. A failed call (unknown
tool, bad arguments, an exception in the tool, a call after the end) is a result with
`isError` and toolgym's message, as the model would read it. `toolgym.mcp(server,
reset_tool="reset", reward_tool="reward")` is the client side of the same shape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from toolgym.cli.env_spec import ResolvedEnv, resolve_env
from toolgym.cli.errors import CLIError

CONTROL_TOOLS = ("reset", "reward", "final_answer")


class Episodes:
    """The environment instances of the sessions, made on first use; the least recently used
    is closed past `max_sessions`, and all of them by `close`."""

    def __init__(self, resolved: ResolvedEnv, sandbox: str | None, max_sessions: int) -> None:
        self.resolved, self.sandbox, self.max_sessions = resolved, sandbox, max_sessions
        self.instances: OrderedDict[str, tuple[Any, asyncio.Lock]] = OrderedDict()
        probe = self._make()  # the tools, listed without a session (and checked now)
        try:
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

    async def get(self, key: str) -> tuple[Any, asyncio.Lock]:
        """The session's instance (made on first use) and the lock its calls take."""
        if key not in self.instances:
            self.instances[key] = (await asyncio.to_thread(self._make), asyncio.Lock())
            while len(self.instances) > self.max_sessions:
                _, (oldest, _) = self.instances.popitem(last=False)
                await asyncio.to_thread(oldest.close)
        self.instances.move_to_end(key)
        return self.instances[key]

    def close(self) -> None:
        """Close every session's instance."""
        while self.instances:
            _, (env, _) = self.instances.popitem()
            with contextlib.suppress(Exception):
                env.close()


def mcp_server(episodes: Episodes, name: str) -> Any:
    """The SDK's low-level `Server` over `episodes`."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    listed = [_listed(schema["function"]) for schema in episodes.tools] + _control_tools()

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        key = _session_key(ctx)
        if key is None:
            return _result(
                "Error: toolgym serve keeps one episode per MCP session, and this request has "
                "none (the 2026-07-28 protocol is sessionless over HTTP): connect with the "
                "initialize handshake, e.g. mcp.Client(url, mode='legacy').",
                error=True,
            )
        env, lock = await episodes.get(key)
        async with lock:
            return await _call(env, params.name, dict(params.arguments or {}))

    return Server(name, on_list_tools=on_list_tools, on_call_tool=on_call_tool)


async def _call(env: Any, name: str, arguments: dict[str, Any]) -> Any:
    """One call in a session, as a `CallToolResult`."""
    from toolgym.envs.calls import ToolCall

    stepper = getattr(env, "stepper", env)
    if name == "reset":
        seed = arguments.pop("seed", None)
        observation = await asyncio.to_thread(env.reset, seed=seed, **arguments)
        return _result("" if observation is None else str(observation), env)
    if not getattr(stepper, "started", True):
        await asyncio.to_thread(env.reset)
    if name == "reward":
        reward = await asyncio.to_thread(env.get_reward)
        text = "null" if reward is None else repr(float(reward))
        state = {"reward": reward, "done": _over(env), "turn": getattr(stepper, "turn", 0)}
        return _result(text, env, structured=state)
    if name == "final_answer":
        await asyncio.to_thread(env.final_answer, str(arguments.get("text", "")))
        return _result("The answer was handed in.", env)
    step = await env.astep(ToolCall(name, arguments))
    (result,) = step.results
    return _result(result.content, env, error=not result.ok, reward=step.reward)


def _result(
    text: str,
    env: Any = None,
    *,
    error: bool = False,
    reward: float = 0.0,
    structured: dict[str, Any] | None = None,
) -> Any:
    import mcp_types as types

    meta = None
    if env is not None:
        stepper = getattr(env, "stepper", env)
        meta = {
            "toolgym/reward": reward,
            "toolgym/done": _over(env),
            "toolgym/turn": getattr(stepper, "turn", 0),
        }
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=error,
        _meta=meta,
    )


def _over(env: Any) -> bool:
    stepper = getattr(env, "stepper", env)
    return bool(
        env.done
        or getattr(stepper, "truncated", False)
        or getattr(stepper, "answered", False)
        or getattr(stepper, "ended", None) is not None
    )


def _session_key(ctx: Any) -> str | None:
    """The MCP session a request belongs to: the stdio process's one client, or the HTTP
    session id (None: a sessionless HTTP request)."""
    request = getattr(ctx, "request", None)
    if request is None:
        return "stdio"
    return request.headers.get("mcp-session-id")


def _listed(function: dict[str, Any]) -> Any:
    import mcp_types as types

    return types.Tool(
        name=function["name"],
        description=function.get("description") or function["name"],
        input_schema=function.get("parameters") or {"type": "object", "properties": {}},
    )


def _control_tools() -> list[Any]:
    import mcp_types as types

    seed = {"type": ["integer", "null"], "description": "The episode's seed."}
    text = {"type": "string", "description": "The final answer."}
    return [
        types.Tool(
            name="reset",
            description="Start a new episode from a dataset row's columns (and a seed); "
            "returns the first observation.",
            input_schema={
                "type": "object",
                "properties": {"seed": seed},
                "additionalProperties": True,
            },
        ),
        types.Tool(
            name="reward",
            description="The episode's reward (null: none), whether it is over, its turns.",
            input_schema={"type": "object", "properties": {}},
        ),
        types.Tool(
            name="final_answer",
            description="Hand in the final answer (text without tool calls) to be graded.",
            input_schema={"type": "object", "properties": {"text": text}, "required": ["text"]},
        ),
    ]


def serve(args: argparse.Namespace) -> int:
    """Serve ENV until interrupted (stdio: until the client closes stdin)."""
    if args.protocol == "openenv":  # toolgym/cli/serve_openenv.py
        if args.stdio:
            raise CLIError("--protocol openenv is served over HTTP and WebSocket, not --stdio")
        from toolgym.cli.serve_openenv import serve_openenv

        signal.signal(signal.SIGTERM, _interrupt)
        with _listening(args.host, args.port) as sock:
            return serve_openenv(args, sock)
    from toolgym.envs.mcp_session import require_sdk

    try:
        require_sdk()
    except ImportError as error:
        raise CLIError(str(error)) from None
    episodes = Episodes(resolve_env(args.env), args.sandbox, args.max_sessions)
    signal.signal(signal.SIGTERM, _interrupt)  # instances close on the way out
    try:
        server = mcp_server(episodes, f"toolgym {args.env}")
        clashes = sorted(set(CONTROL_TOOLS) & {t["function"]["name"] for t in episodes.tools})
        if clashes:
            raise CLIError(f"{args.env}: its tools {clashes} clash with toolgym's control tools")
        if args.stdio:
            asyncio.run(_serve_stdio(server))
        else:
            with _listening(args.host, args.port) as sock:
                asyncio.run(_serve_http(server, sock, args.host))
    except KeyboardInterrupt:
        pass
    finally:
        episodes.close()
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


async def _serve_stdio(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


@contextlib.contextmanager
def _listening(host: str, port: int) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise CLIError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    with sock:
        yield sock


async def _serve_http(server: Any, sock: socket.socket, host: str) -> None:
    import uvicorn

    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    port = sock.getsockname()[1]
    print(f"http://{host}:{port}/mcp", flush=True)  # first, for scripts to read
    await uvicorn.Server(config).serve(sockets=[sock])


def add_serve_command(commands: Any) -> None:
    """The `serve` subcommand."""
    parser = commands.add_parser(
        "serve",
        help="serve an environment over a protocol (MCP, OpenEnv), one instance per session",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("env", metavar="ENV", help="an id, path/to/file.py:Class or module:attr")
    parser.add_argument(
        "--protocol", default="mcp", choices=["mcp", "openenv"], help="the protocol"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--stdio", action="store_true", help="serve one client over stdio")
    where.add_argument("--port", type=int, default=8000, help="HTTP port (0: any)")
    parser.add_argument("--host", default="127.0.0.1", help="where to listen (loopback)")
    parser.add_argument("--sandbox", default=None, help="local, process, docker, ray or auto")
    parser.add_argument("--max-sessions", type=int, default=64, help="instances kept at once")
    parser.set_defaults(handler=serve)
