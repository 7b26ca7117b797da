"""Who may talk to a server toolgym listens with: the checks `toolgym serve` (MCP and OpenEnv),
`toolgym endpoint` and the run viewer make before a request reaches them.

A web page the user visits can send requests to `127.0.0.1:PORT` (simple cross-site POSTs,
WebSocket upgrades, and through DNS rebinding requests under its own name). `Guard` refuses:

- a `Host` header that is not the server's own loopback name (`127.0.0.1:PORT`,
  `localhost:PORT`, `[::1]:PORT`) while bound to loopback: 421 (DNS rebinding);
- an `Origin` header that is not the server's own origin: 403 (no `Origin`, as non-browser
  clients send, passes);
- a POST, PUT or PATCH whose `Content-Type` is not `application/json`: 415 (a cross-site page
  can send `text/plain` without asking; `application/json` needs a CORS preflight, which these
  servers never grant);
- where a token is set (always beyond loopback), a request or WebSocket upgrade without it:
  401 (a WebSocket: 403, the only refusal of a handshake), compared in constant time. The token
  travels as `Authorization: Bearer TOKEN`, as a URL's password (`http://toolgym:TOKEN@host`,
  Basic authentication: what `websockets` and `httpx` send for such a URL) or as
  `X-Toolgym-Token: TOKEN`; a credential `TOKEN:REST` passes too (the endpoint reads REST as a
  session's name).

Beyond loopback any `Host` is accepted (the machine's names are not known here; the token is
the guard there) and an `Origin` must name the `Host` the request was sent to.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_VARIABLE = "TOOLGYM_TOKEN"
"""The environment variable a token is read from when `--token` is not given."""
TOKEN_HEADER = "x-toolgym-token"
MIN_TOKEN_LENGTH = 16
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
BODY_METHODS = ("POST", "PUT", "PATCH")


def is_loopback(host: str) -> bool:
    """Whether binding `host` listens on this machine only (`127.0.0.0/8`, `::1`, localhost)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def check_token(token: str | None, host: str) -> None:
    """ValueError unless `token` is usable: at least `MIN_TOKEN_LENGTH` characters, and set
    at all when `host` is beyond loopback."""
    if token is None:
        if not is_loopback(host):
            raise ValueError(
                f"listening on {host} (beyond loopback) needs a token: pass --token or set "
                f"{TOKEN_VARIABLE} (at least {MIN_TOKEN_LENGTH} characters)"
            )
        return
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() or c == ":" for c in token):
        raise ValueError(
            f"the --token must be at least {MIN_TOKEN_LENGTH} characters, without spaces or ':'"
        )


def chosen_token(given: str | None, host: str) -> tuple[str | None, bool]:
    """(the token to use, whether it was made here): `given`, else `$TOOLGYM_TOKEN`, else a
    new random one where `host` is beyond loopback (None on loopback). ValueError for a
    token too short."""
    token = given if given is not None else os.environ.get(TOKEN_VARIABLE) or None
    made = False
    if token is None and not is_loopback(host):
        token, made = secrets.token_urlsafe(24), True
    check_token(token, host)
    return token, made


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: its HTTP status, a code and a message."""

    status: int
    code: str
    message: str

    def body(self) -> bytes:
        """The JSON body (OpenAI's error shape, which the other servers' clients read too)."""
        error = {"message": self.message, "type": "forbidden", "code": self.code}
        return json.dumps({"error": error, "detail": self.message}).encode()


class Guard:
    """The Host, Origin, Content-Type and token checks of one listening server.

    Args:
        host: The address the server binds.
        token: The token every request must carry (None: none; refused beyond loopback).
        port: The port, when the ASGI scope does not tell it (the viewer's server).
    """

    def __init__(self, host: str, token: str | None = None, port: int | None = None) -> None:
        check_token(token, host)
        self.host, self.token, self.port = host, token, port
        self.loopback = is_loopback(host)
        bound = host.lower() if ":" not in host or host.startswith("[") else f"[{host}]"
        self.names = {*LOOPBACK_NAMES, bound}

    def refusal(
        self, method: str, headers: Mapping[str, str], port: int | None = None
    ) -> Refusal | None:
        """Why a request with these (lower-cased) headers is refused; None: it passes."""
        port = port if port is not None else self.port
        host = headers.get("host", "").strip().lower()
        if not self.host_allowed(host, port):
            return Refusal(
                421,
                "foreign_host",
                f"refused: the Host header {host[:100]!r} is not this server's (DNS rebinding?)",
            )
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host, port):
            return Refusal(
                403,
                "foreign_origin",
                f"refused: requests from {origin[:100]!r} (another site) are not served",
            )
        if method.upper() in BODY_METHODS:
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return Refusal(
                    415,
                    "not_json",
                    "refused: a request body must be Content-Type: application/json",
                )
        if self.token is not None and not self.admits(headers):
            return Refusal(
                401,
                "token_required",
                "refused: this server needs its token (Authorization: Bearer TOKEN, the URL's "
                "password, or X-Toolgym-Token)",
            )
        return None

    def host_allowed(self, host: str, port: int | None) -> bool:
        """Whether the Host header names this server (any, beyond loopback)."""
        if not self.loopback:
            return bool(host)
        return port is not None and host in {f"{name}:{port}" for name in self.names}

    def origin_allowed(self, origin: str, host: str, port: int | None) -> bool:
        """Whether `Origin` is this server's own (`http://` + an allowed Host)."""
        origin = origin.strip().lower()
        scheme, _, named = origin.partition("://")
        if scheme not in ("http", "https") or "/" in named:
            return False
        if self.loopback:
            return self.host_allowed(named, port)
        return named == host

    def admits(self, headers: Mapping[str, str]) -> bool:
        """Whether a credential among the headers is the token (constant time per compare)."""
        return any(self.matches(credential) for credential in credentials(headers))

    def matches(self, credential: str) -> bool:
        """Whether `credential` is the token, or `TOKEN:REST`."""
        if self.token is None:
            return True
        head = credential.encode()[: len(self.token.encode())]
        rest = credential.encode()[len(self.token.encode()) :]
        return hmac.compare_digest(head, self.token.encode()) and (not rest or rest[:1] == b":")

    def asgi(self, app: App) -> App:
        """`app` behind the checks: a refused HTTP request gets the refusal's status and JSON
        body; a refused WebSocket upgrade is closed before it is accepted (403)."""

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] not in ("http", "websocket"):
                return await app(scope, receive, send)
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            server = scope.get("server") or (None, None)
            method = scope.get("method", "GET") if scope["type"] == "http" else "GET"
            refused = self.refusal(method, headers, server[1])
            if refused is None:
                return await app(scope, receive, send)
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": refused.code})
                return None
            await send_refusal(send, refused)
            return None

        return guarded


def credentials(headers: Mapping[str, str]) -> list[str]:
    """The credentials a request carries: the bearer token, a Basic password, the header."""
    found = []
    authorization = headers.get("authorization", "").strip()
    kind, _, value = authorization.partition(" ")
    if kind.lower() == "bearer" and value.strip():
        found.append(value.strip())
    elif kind.lower() == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        found.append(decoded.partition(":")[2])
    if headers.get(TOKEN_HEADER):
        found.append(headers[TOKEN_HEADER].strip())
    return found


async def send_refusal(send: Send, refused: Refusal, extra: dict[str, str] | None = None) -> None:
    """Answer an HTTP request with `refused` (JSON)."""
    body = refused.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refused.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="toolgym"'))
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
