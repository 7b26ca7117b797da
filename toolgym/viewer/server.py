"""The viewer's HTTP server: the page's static files and a small JSON API, on 127.0.0.1.

Routes (all GET):

- `/` the page; `/static/<file>` its script and style sheet.
- `/api/summary` the run: its files with episode and malformed-line counts, evaluation modes,
  the tokenizer's state.
- `/api/metrics?version=V` the rows of `metrics.jsonl` with a `version`; when the file has not
  changed since `V`, only `{"version": V, "unchanged": true}`.
- `/api/episodes?source=&status=&q=&step_min=&step_max=&reward_min=&reward_max=&sort=&offset=
  &limit=` one page of episode summaries and the counts (`total`, `matched`, `statuses`).
- `/api/episode?source=NAME&index=I` one full episode, with the prompt and completion tokens
  of its last sample decoded (`mask`, `logprob` per completion token) and its number of
  `samples` (one per turn in per-turn episodes).
- `/api/compare?mode=greedy&row=I` row I of each evaluation stage of that mode, side by side
  (paired by line number: a `warning` says when their dataset rows differ).

Errors come back as JSON `{"error": message}`: 400 for a bad request, 404 for a missing file or
episode, 500 for anything unexpected. A request whose `Host` header is not this server's own
address (`127.0.0.1:<port>` or `localhost:<port>`) gets 403, so a web page that rebinds its
DNS name to 127.0.0.1 cannot read the run, and so does a request whose `Origin` is another
site's (a browser's request from another page; no `Origin`, as from other clients, passes);
every response forbids other origins' scripts,
styles and frames (`Content-Security-Policy`) and content sniffing.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from toolgym.viewer.data import EVAL_FILE, EpisodeQuery, RunData, sample_graph, shown_sample
from toolgym.viewer.tokens import TokenDecoder

STATIC = Path(__file__).resolve().parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
TOKEN_FIELDS = ("samples", "prompt_ids", "completion_ids", "loss_mask", "logprobs", "turns")
"""Left out of the episode JSON (the token view decodes the last sample instead)."""
SECURITY_HEADERS = {
    # data: images: a tool result's pictures (raster only; see app.js), never scripts
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""Sent with every response: only this server's own scripts and styles run on the page."""

logger = logging.getLogger(__name__)


def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None (strict JSON for the browser)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _list(value: Any) -> list[Any]:
    """`value` if it is a list, else an empty one (a token field of the wrong shape)."""
    return value if isinstance(value, list) else []


class RequestError(Exception):
    """A request the API cannot answer: its message goes back with `status`."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


class ViewerApp:
    """Answers the API routes from a `RunData` and a `TokenDecoder` (no HTTP in here, so the
    answers are easy to test).

    Args:
        data: The run or file being viewed.
        decoder: Decodes token ids for the token view.
    """

    def __init__(self, data: RunData, decoder: TokenDecoder) -> None:
        self.data = data
        self.decoder = decoder
        self.refresh_error: str | None = None

    def answer(self, route: str, params: dict[str, str]) -> dict[str, Any]:
        """The JSON answer of `/api/<route>` (RequestError for a bad request).

        The run is re-read first; if that fails, the answer comes from what was indexed before
        and `/api/summary` carries the failure as `refresh_error`."""
        handlers = {
            "summary": self.summary,
            "metrics": self.metrics,
            "episodes": self.episodes,
            "episode": self.episode,
            "compare": self.compare,
        }
        if route not in handlers:
            raise RequestError(f"no API route {route!r}", HTTPStatus.NOT_FOUND)
        self._refresh()
        try:
            return handlers[route](params)
        except (KeyError, IndexError) as error:
            raise RequestError(str(error.args[0]), HTTPStatus.NOT_FOUND) from error
        except ValueError as error:
            raise RequestError(str(error)) from error

    def _refresh(self) -> None:
        """Re-read the run; a failure is logged and kept in `refresh_error`, not raised."""
        try:
            self.data.refresh()
        except Exception as error:  # a read that fails now may work on the next request
            if self.refresh_error is None:
                logger.exception("the viewer could not re-read %s", self.data.path)
            self.refresh_error = f"could not re-read the run: {type(error).__name__}: {error}"
        else:
            self.refresh_error = None

    def summary(self, params: dict[str, str]) -> dict[str, Any]:
        """`/api/summary`."""
        described = self.data.describe()
        described["tokenizer"] = self.decoder.describe()
        described["refresh_error"] = self.refresh_error
        return described

    def metrics(self, params: dict[str, str]) -> dict[str, Any]:
        """`/api/metrics`."""
        if self.data.metrics is None:
            return {"version": "none", "rows": [], "malformed": 0, "available": False}
        version, rows = self.data.metrics.read()
        if params.get("version") == version:
            return {"version": version, "unchanged": True}
        malformed = self.data.metrics.malformed
        return {"version": version, "rows": rows, "malformed": malformed, "available": True}

    def episodes(self, params: dict[str, str]) -> dict[str, Any]:
        """`/api/episodes`."""
        return self.data.episodes(EpisodeQuery.from_params(params))

    def episode(self, params: dict[str, str]) -> dict[str, Any]:
        """`/api/episode` (`sample`: which of the episode's samples the tokens are; default
        the last)."""
        episode_file = self.data.file(params.get("source", ""))
        index = int(params.get("index", ""))
        data = episode_file.read(index)
        tokenizer = self.decoder.describe()  # before decoding: "pending" errs towards a re-fetch
        chosen = int(params["sample"]) if params.get("sample") else None
        sample, samples = shown_sample(data, chosen)
        return {
            "summary": episode_file.summary(index),
            "episode": {k: v for k, v in data.items() if k not in TOKEN_FIELDS},
            "prompt_tokens": self.decoder.tokens(_list(sample.get("prompt_ids"))),
            "completion_tokens": self.decoder.tokens(
                _list(sample.get("completion_ids")),
                _list(sample.get("loss_mask")),
                _list(sample.get("logprobs")),
            ),
            "samples": samples,
            "sample": samples - 1 if chosen is None else chosen,
            "graph": sample_graph(data),
            "tokenizer": tokenizer,
        }

    def compare(self, params: dict[str, str]) -> dict[str, Any]:
        """`/api/compare`."""
        modes = self.data.compare_modes()
        mode = params.get("mode") or next(iter(modes), "")
        if mode not in modes:
            raise RequestError(f"no evaluation files for mode {mode!r}", HTTPStatus.NOT_FOUND)
        row = int(params.get("row") or 0)
        files = [self.data.file(name) for name in modes[mode]]
        sides = [self._side(f.name, f, row) for f in files]
        answer = {"mode": mode, "row": row, "rows": max(len(f) for f in files), "sides": sides}
        rows = {
            json.dumps(side["episode"].get("row"), sort_keys=True, default=str)
            for side in sides
            if "episode" in side
        }
        if len(rows) > 1:
            answer["warning"] = (
                f"the sides' dataset rows differ: the files are paired by line number, so line"
                f" {row} of each may be a different task (were they evaluated on the same"
                f" dataset, in the same order?)"
            )
        return answer

    def _side(self, name: str, episode_file: Any, row: int) -> dict[str, Any]:
        """One stage's episode on line `row` (no `episode` where the file is shorter)."""
        match = EVAL_FILE.match(name)
        side: dict[str, Any] = {"source": name, "stage": match["stage"] if match else name}
        if 0 <= row < len(episode_file):
            data = episode_file.read(row)
            side["summary"] = episode_file.summary(row)
            side["episode"] = {k: v for k, v in data.items() if k not in TOKEN_FIELDS}
        return side


class _Handler(BaseHTTPRequestHandler):
    """Serves the static files and `/api/*` from the server's `ViewerApp`."""

    server: _HTTPServer

    def do_GET(self) -> None:
        """Answer one GET request."""
        url = urlsplit(self.path)
        if not self._host_allowed():
            self._send(HTTPStatus.FORBIDDEN, b"forbidden: unknown Host header", "text/plain")
        elif not self._origin_allowed():
            self._send(HTTPStatus.FORBIDDEN, b"forbidden: another site's Origin", "text/plain")
        elif url.path.startswith("/api/"):
            self._api(url.path.removeprefix("/api/"), dict(parse_qsl(url.query)))
        elif url.path in ("/", "/index.html"):
            self._static("index.html")
        elif url.path.startswith("/static/"):
            self._static(url.path.removeprefix("/static/"))
        elif url.path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "text/plain")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")

    def _host_allowed(self) -> bool:
        """Whether the Host header names this server (127.0.0.1, localhost or the bound
        address, with its port): a DNS-rebound name does not."""
        return (self.headers.get("Host") or "").strip().lower() in self._names()

    def _origin_allowed(self) -> bool:
        """Whether the request has no `Origin`, or this server's own (`http://` + a name of
        `_names`): a page of another site does not."""
        origin = self.headers.get("Origin")
        if origin is None:
            return True
        scheme, _, named = origin.strip().lower().partition("://")
        return scheme == "http" and named in self._names()

    def _names(self) -> set[str]:
        host, port = _host_and_port(self.server.server_address)
        return {f"{name}:{port}" for name in ("127.0.0.1", "localhost", "[::1]", host)}

    def _api(self, route: str, params: dict[str, str]) -> None:
        """Answer `/api/<route>` as JSON, errors included (500 for an unexpected one)."""
        try:
            answer, status = self.server.app.answer(route, params), HTTPStatus.OK
            body = json.dumps(json_safe(answer), allow_nan=False, default=str).encode()
        except Exception as error:
            if isinstance(error, RequestError):
                message, status = str(error), error.status
            else:
                logger.exception("the viewer failed to answer /api/%s", route)
                message = f"internal error in /api/{route}: {type(error).__name__}: {error}"
                status = HTTPStatus.INTERNAL_SERVER_ERROR
            body = json.dumps({"error": message}).encode()
        self._send(status, body, "application/json")

    def _static(self, name: str) -> None:
        """Send one file of `static/` (404 for anything else)."""
        path = (STATIC / name).resolve()
        if path.parent != STATIC or not path.is_file():
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")
            return
        content_type = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
        self._send(HTTPStatus.OK, path.read_bytes(), content_type)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        """Send one response, with the `SECURITY_HEADERS`."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: no line per request."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    app: ViewerApp


class ViewerServer:
    """A running viewer: its `url`, and `close()` (also a context manager).

    Args:
        app: What the API answers from.
        host: The address to bind (127.0.0.1: this machine only).
        port: The port; 0 picks a free one.
    """

    def __init__(self, app: ViewerApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        try:
            self._httpd = _HTTPServer((host, port), _Handler)
        except OSError as error:
            raise OSError(f"cannot listen on {host}:{port} ({error}); try port 0") from error
        self._httpd.app = app
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="toolgym-viewer", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """The page's address, e.g. `http://127.0.0.1:8765/`."""
        host, port = _host_and_port(self._httpd.server_address)
        return f"http://{host}:{port}/"

    def wait(self) -> None:
        """Block until the server is closed (or the process interrupted)."""
        self._thread.join()

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ViewerServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _host_and_port(address: Any) -> tuple[str, int]:
    """A TCP server's bound host (as text) and port."""
    host, port = address[:2]
    return (host.decode() if isinstance(host, bytes) else str(host)), int(port)
