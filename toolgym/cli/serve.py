"""`toolgym serve ENV --protocol mcp [--stdio | --port P]`: an environment as an MCP server.

Any ENV the other commands take (a registered id, `path/to/file.py:Class`, `module:attr`) is
served with the `mcp` SDK's low-level server, one environment instance per MCP session: the
stdio server's one client (a process per client), or each streamable HTTP session
(`Mcp-Session-Id`). Over HTTP the server advertises only the handshake-era protocol versions
in `server/discover` (episodes need sessions, which the sessionless 2026-07-28 protocol does
not have), so the SDK's default client falls back to the initialize handshake by itself; a
2026-07-28 request that reaches a tool anyway is answered with an error, whatever session id
it names.

Over HTTP it listens on loopback, refuses foreign Host and Origin headers and non-JSON bodies,
and needs a token beyond loopback (`toolgym.cli.listening`, `toolgym.http_guard`). At
most `--max-sessions` sessions exist: a newcomer past them is refused with an error naming
the flag, never by closing a live one; a session idle past `--session-idle-timeout` is closed
with its instance. A class that runs the model's code is served only in a sandbox.

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
import json
import signal
import socket
import time
from typing import Any

from toolgym.cli.env_spec import resolve_env
from toolgym.cli.errors import CLIError
from toolgym.cli.listening import (
    add_listening_arguments,
    checked_limits,
    full_message,
    listening,
    token_for,
    url,
)
from toolgym.cli.serve_episodes import Episodes, SessionRefused

CONTROL_TOOLS = ("reset", "reward", "final_answer")
SESSIONLESS = (
    "Error: toolgym serve keeps one episode per MCP session, and this request has none (the "
    "2026-07-28 protocol is sessionless over HTTP): connect with the initialize handshake, as "
    "mcp.Client(url) does by itself against this server (or mode='legacy')."
)


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
            return _result(SESSIONLESS, error=True)
        try:
            episode = await episodes.get(key)
        except SessionRefused as refused:
            return _result(f"Error: {refused}", error=True)
        async with episode.lock:
            try:
                return await _call(episode.env, params.name, dict(params.arguments or {}))
            finally:
                episode.used = time.monotonic()

    return Server(name, on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def _handshake_only(server: Any) -> None:
    """Advertise only the handshake-era versions in `server/discover`: the SDK's default
    client (`mode='auto'`) then falls back to the initialize handshake, whose sessions hold
    the episodes (as the go SDK's stateful servers advertise)."""
    import mcp_types as types
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    async def on_discover(ctx: Any, params: Any) -> Any:
        return types.DiscoverResult(
            supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
            capabilities=server.get_capabilities(protocol_version=ctx.protocol_version),
            instructions=server.instructions,
        )

    server.add_request_handler("server/discover", types.RequestParams, on_discover)


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
    session id the SDK routed it by (None: a sessionless request, whose `Mcp-Session-Id`
    header, if any, no session transport checked: it must not name another's episode)."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    request = getattr(ctx, "request", None)
    if request is None:
        return "stdio"
    if ctx.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
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
    checked_limits(args)
    if args.protocol == "openenv":  # toolgym/cli/serve_openenv.py
        if args.stdio:
            raise CLIError("--protocol openenv is served over HTTP and WebSocket, not --stdio")
        from toolgym.cli.serve_openenv import serve_openenv

        token = token_for(args, "serve")
        signal.signal(signal.SIGTERM, _interrupt)
        with listening(args.host, args.port) as sock:
            return serve_openenv(args, sock, token)
    from toolgym.adapters.mcp_session import require_sdk

    try:
        require_sdk()
    except ImportError as error:
        raise CLIError(str(error)) from None
    token = None if args.stdio else token_for(args, "serve")
    idle = None if args.stdio else args.session_idle_timeout
    episodes = Episodes(resolve_env(args.env), args.sandbox, args.max_sessions, idle)
    signal.signal(signal.SIGTERM, _interrupt)  # instances close on the way out
    try:
        server = mcp_server(episodes, f"toolgym {args.env}")
        clashes = sorted(set(CONTROL_TOOLS) & {t["function"]["name"] for t in episodes.tools})
        if clashes:
            raise CLIError(f"{args.env}: its tools {clashes} clash with toolgym's control tools")
        if args.stdio:
            asyncio.run(_serve_stdio(server))
        else:
            with listening(args.host, args.port) as sock:
                asyncio.run(_serve_http(server, sock, args, episodes, token))
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


async def _serve_http(
    server: Any, sock: socket.socket, args: Any, episodes: Episodes, token: str | None
) -> None:
    import uvicorn

    from toolgym.http_guard import Guard

    _handshake_only(server)
    app = server.streamable_http_app(
        host=args.host,
        max_sessions=args.max_sessions,
        session_idle_timeout=args.session_idle_timeout,
    )
    full = full_message("toolgym serve", args.max_sessions, args.session_idle_timeout)
    guarded = Guard(args.host, token).asgi(_session_ends(app, episodes, full))
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    port = sock.getsockname()[1]
    sock.listen(128)  # a client that reads the URL may connect at once (it waits in line)
    print(url(args.host, port, token, "/mcp"), flush=True)  # first, for scripts to read
    reaper = asyncio.create_task(episodes.reap_forever())
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        reaper.cancel()


def _session_ends(app: Any, episodes: Episodes, full: str) -> Any:
    """`app`, which also closes a session's episode when its client deletes the session
    (before the answer goes out), and explains the SDK's 503 to a newcomer past
    `--max-sessions` (`full`, as a JSON-RPC error)."""

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = headers.get("mcp-session-id")
        replaced = False

        async def watching(message: Any) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start":
                status = message["status"]
                if status == 503 and key is None:
                    replaced = True
                    return await _send_full(send, full)
                if scope["method"] == "DELETE" and key is not None and 200 <= status < 300:
                    await episodes.end(key)
            if not replaced:
                await send(message)

        await app(scope, receive, watching)

    return watched


async def _send_full(send: Any, full: str) -> None:
    error = {"code": -32000, "message": full}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
    parser.add_argument(
        "--sandbox",
        default=None,
        help="local, process, docker, ray or auto (default: an id's registered choice, a "
        "class in this process; a class that runs the model's code needs one)",
    )
    add_listening_arguments(parser, max_sessions=64)
    parser.set_defaults(handler=serve)
