"""`toolgym serve ENV --protocol openenv [--port P]`: an environment as an OpenEnv server.

Served with openenv-core's own server (`create_fastapi_app`: `/ws` sessions, `/reset`,
`/step`, `/state`, `/schema`, `/health`, `/metadata`), so that its clients
(`GenericEnvClient(base_url=url)`, sync or async) drive it: one environment instance per
WebSocket session, closed when the session ends or has been idle `--session-idle-timeout`
seconds. The stateless HTTP `/reset` and `/step` make an instance per request, as
openenv-core's are; sessions and stateless requests together hold at most `--max-sessions`
instances at once (past it a newcomer is refused, naming the flag: openenv-core's
CAPACITY_REACHED error on a WebSocket, 503 over HTTP; see `toolgym.cli.openenv_gate`). The
server listens on loopback, refuses foreign Host and Origin headers (WebSocket upgrades
included) and non-JSON bodies, and needs a token beyond loopback (the URL it prints carries
it); a class that runs the model's code is served only in a sandbox.

- **Action** (`ToolCallAction`): `{"tool": NAME, "arguments": {...}}`, where NAME is one of
  the environment's tools (an enum in `/schema`) or `final_answer` (`{"text": ...}`: the
  model's last message, handed to the environment to grade; the episode is then over).
  A step before any reset resets first, without arguments.
- **Observation** (`ToolCallObservation`): `content` (the tool message, or the reset's text),
  `tool`, `failure` (toolgym's failure kind, None when the call succeeded), `turn`, and at
  reset `tools` (the tools' JSON schemas); `reward` is the step's reward (its change, for an
  environment with per-step rewards; else None until the step that ends the episode, which
  carries the episode's reward; None throughout where the environment gives none) and
  `done` whether the episode is over (done, answered, the turn limit, or a failure).
- **Reset**: `reset(seed=..., **columns)` starts an episode from a dataset row's columns.
- **State**: `episode_id`, `step_count`, and toolgym's `reward` (the episode's so far),
  `done` and `turn`.

`toolgym.openenv(url, observation=lambda o: o["content"])` is the client side of the same
shape (its one tool is `tool_call`, with `tool` and `arguments`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import weakref
from typing import Any

from toolgym.cli.env_spec import ResolvedEnv, resolve_env
from toolgym.cli.errors import CLIError
from toolgym.cli.listening import full_message, refuse_unsandboxed, url
from toolgym.cli.openenv_gate import gated
from toolgym.http_guard import Guard


def serve_openenv(args: Any, sock: socket.socket, token: str | None = None) -> int:
    """Serve `args.env` over OpenEnv on the bound socket `sock` until interrupted."""
    from toolgym.adapters.openenv import require_openenv

    try:
        require_openenv()
    except ImportError as error:
        raise CLIError(str(error)) from None
    import uvicorn

    made: weakref.WeakSet[Any] = weakref.WeakSet()
    try:
        app = openenv_app(resolve_env(args.env), args.sandbox, args.max_sessions, made)
        full = full_message("toolgym serve", args.max_sessions, args.session_idle_timeout)
        app = gated(_quiet_disconnects(app), args.max_sessions, args.session_idle_timeout, full)
        config = uvicorn.Config(
            Guard(args.host, token).asgi(app), log_level="warning", lifespan="on"
        )
        port = sock.getsockname()[1]
        sock.listen(128)  # a client that reads the URL may connect at once (it waits in line)
        print(url(args.host, port, token), flush=True)  # first, for scripts to read
        asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    finally:
        for environment in list(made):
            environment.close()
    return 0


def openenv_app(
    resolved: ResolvedEnv, sandbox: str | None, max_sessions: int, made: Any = None
) -> Any:
    """openenv-core's FastAPI app over instances of `resolved` (each added to `made`)."""
    from openenv.core.env_server import create_fastapi_app

    from toolgym.cli.openenv_served import ServedEnvironment, ToolCallObservation, action_class

    def make() -> Any:
        try:
            env = resolved.make(sandbox=sandbox)
        except CLIError:
            raise
        except Exception as error:
            raise CLIError(f"{resolved.spec}: {type(error).__name__}: {error}") from None
        if made is not None:
            made.add(env)
        return env

    probe = make()  # the tools (and the environment checked) before serving
    try:
        refuse_unsandboxed(probe, resolved.spec)
        tools = probe.tools
    finally:
        probe.close()
    names = [tool["function"]["name"] for tool in tools]
    if "final_answer" in names:
        raise CLIError(f"{resolved.spec}: its tool 'final_answer' clashes with toolgym's")
    return create_fastapi_app(
        functools.partial(ServedEnvironment, make, resolved.spec, names),
        action_class(tools),
        ToolCallObservation,
        max_concurrent_envs=max_sessions,
    )


def _quiet_disconnects(app: Any) -> Any:
    """`app`, less the traceback openenv-core 0.3's `/ws` raises when it closes a session whose
    client has already gone (its `websocket.close()` after the client's own close)."""
    from starlette.websockets import WebSocketDisconnect

    async def quiet(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await app(scope, receive, send)
        with contextlib.suppress(WebSocketDisconnect):
            await app(scope, receive, send)

    return quiet
