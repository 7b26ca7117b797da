"""JSON over HTTP to an inference server, with the two kinds of failure a pool tells apart:
`ServerGone` (no answer, or an error on the server's side: another server may take the
request) and `ServerError` (the server refused the request itself)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import urllib.parse
from collections.abc import Callable
from typing import Any


class ServerError(RuntimeError):
    """The server answered with an error or could not be reached."""


class ServerGone(ServerError):
    """The server could not be reached or failed on its side: another one may take the
    request."""


Connected = Callable[[http.client.HTTPConnection], None]
"""Told of a request's connection once it is open (a pool cuts those of a server that hangs)."""


def call_json(
    url: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = 600.0,
    connected: Connected | None = None,
) -> Any:
    """`method url+path` with a JSON body; the decoded JSON answer (None when empty)."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    try:
        connection.connect()
        if connected is not None:
            connected(connection)
        headers = {"Content-Type": "application/json"}
        connection.request(method, parts.path.rstrip("/") + path, body=data, headers=headers)
        response = connection.getresponse()
        status, payload = response.status, response.read()
    except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, cut
        raise ServerGone(f"{method} {path}: cannot reach {url}: {error!r}") from None
    finally:
        connection.close()
    if status >= 400:
        detail = payload.decode(errors="replace")[:500]
        hint = (
            " (start the server with VLLM_SERVER_DEV_MODE=1)"
            if path == "/collective_rpc" and status == 404
            else ""
        )
        failure = ServerGone if status >= 500 else ServerError
        raise failure(f"{method} {url}{path} -> HTTP {status}: {detail}{hint}")
    return json.loads(payload) if payload else None


def cut(connection: http.client.HTTPConnection) -> None:
    """End a request blocked on `connection` (from another thread): its call raises
    `ServerGone`."""
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)
