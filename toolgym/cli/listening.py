"""The options every listening command shares (`toolgym serve`, `toolgym endpoint`): where to
listen, the token, how many sessions at once and how long an idle one lives; the bound socket;
and the one message a newcomer past `--max-sessions` gets.

Loopback (127.0.0.1) is the default. Beyond it (`--host 0.0.0.0`, a LAN address) every request
needs the token: `--token`, else `$TOOLGYM_TOKEN`, else one made at start and printed (on
stderr, and in the URL a server prints first). See `toolgym.http_guard` for the checks.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import socket
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from toolgym.cli.errors import CLIError
from toolgym.http_guard import TOKEN_VARIABLE, chosen_token

IDLE_TIMEOUT = 600.0
"""Seconds a session may stay idle before it is closed (`--session-idle-timeout`)."""


def add_listening_arguments(parser: Any, max_sessions: int) -> None:
    """`--host`, `--token`, `--max-sessions` and `--session-idle-timeout`."""
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="where to listen (default loopback; anywhere else needs the token)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"the token every request must carry (default ${TOKEN_VARIABLE}; beyond loopback "
        "one is made and printed if none is given); a flag is visible to other local users in "
        f"the process list, ${TOKEN_VARIABLE} is not",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=max_sessions,
        help="sessions at once; a newcomer past it is refused (no live session is closed for it)",
    )
    parser.add_argument(
        "--session-idle-timeout",
        type=float,
        default=IDLE_TIMEOUT,
        metavar="SECONDS",
        help="an idle session is closed after this long (default %(default)s)",
    )


def checked_limits(args: argparse.Namespace) -> None:
    """CLIError for a `--max-sessions` below 1 or a timeout that is not a positive number."""
    if args.max_sessions < 1:
        raise CLIError(f"--max-sessions must be at least 1, not {args.max_sessions}")
    timeout = args.session_idle_timeout
    if not (math.isfinite(timeout) and timeout > 0):
        raise CLIError(
            f"--session-idle-timeout must be a positive number of seconds, not {timeout}"
        )


def token_for(args: argparse.Namespace, command: str) -> str | None:
    """The token the server checks (see the module docstring); a made one is said on stderr."""
    try:
        token, made = chosen_token(args.token, args.host)
    except ValueError as error:
        raise CLIError(str(error)) from None
    if made:
        print(
            f"toolgym {command}: listening on {args.host} needs a token; made one: {token} (set "
            f"--token or ${TOKEN_VARIABLE} to choose it)",
            file=sys.stderr,
            flush=True,
        )
    return token


def url(host: str, port: int, token: str | None, path: str = "") -> str:
    """`http://host:port/path`, with the token as the URL's password where there is one
    (`websockets`, `httpx` and the SDKs built on them send it as Basic authentication)."""
    where = f"[{host}]" if ":" in host and not host.startswith("[") else host
    credentials = f"toolgym:{quote(token, safe='')}@" if token else ""
    return f"http://{credentials}{where}:{port}{path}"


def full_message(what: str, max_sessions: int, idle_timeout: float | None) -> str:
    """What a newcomer past `--max-sessions` is told."""
    idle = (
        f" (idle ones close after --session-idle-timeout {idle_timeout:g} s)"
        if idle_timeout
        else ""
    )
    return (
        f"{what} is full: its --max-sessions {max_sessions} sessions are in use, and no live "
        f"session is closed for a new one. Retry when one ends{idle}, or restart the server "
        "with a larger --max-sessions."
    )


@contextlib.contextmanager
def listening(host: str, port: int) -> Iterator[socket.socket]:
    """A socket bound to (host, port); CLIError naming the address when it cannot be."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as error:
        sock.close()
        raise CLIError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    with sock:
        yield sock


def refuse_unsandboxed(env: Any, spec: str) -> None:
    """CLIError where `env` (a made instance) runs the model's code in this process: a server
    would run code for whoever reaches it, as this user. Sandboxed instances (whose instance
    lives in a worker: `unwrapped` is None) pass."""
    instance = getattr(env, "unwrapped", None)
    if instance is not None and getattr(instance, "runs_model_code", False):
        raise CLIError(
            f"{spec}: {type(instance).__name__} runs the model's code (runs_model_code), and "
            "served in this process it would run it as you for whoever reaches the server: "
            "serve it in a sandbox with --sandbox process (or docker, ray, auto)"
        )
