"""A small headless-Chromium driver for the tests, over the Chrome DevTools Protocol (CDP).

`Browser()` starts the system `chromium` (Debian package; `scripts/browser_setup.sh` installs
it) with a throwaway profile and `--remote-debugging-port=0`, reads the port Chromium picked
from `<profile>/DevToolsActivePort`, opens one page and talks to it over one websocket
(`websockets.sync.client`, flattened target sessions). It can navigate, evaluate JavaScript,
wait for a JS condition and save a PNG screenshot; JavaScript exceptions, console errors and
the browser's own error messages (a Content-Security-Policy violation, say; failed network
requests are left to the page) are collected in `errors`. `close()` (or leaving the `with`
block) always kills the browser and its child processes and deletes the profile.

```python
with Browser() as browser:
    browser.goto("http://127.0.0.1:8765/", ready="document.body.dataset.ready === '1'")
    print(browser.evaluate("document.title"))
    browser.screenshot("page.png")
```
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The path of an installed Chromium (or Chrome), or None."""
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    """Chromium did not start, a CDP command failed, or a wait timed out."""


class Browser:
    """One headless Chromium with one page (see the module docstring).

    Args:
        width: The viewport width in CSS pixels.
        height: The viewport height.
        binary: The browser to run (default: `find_chromium()`).
        timeout: Seconds to wait for the browser to start and for each command.
    """

    def __init__(
        self, width: int = 1400, height: int = 1000, binary: str | None = None, timeout: float = 30
    ) -> None:
        binary = binary or find_chromium()
        if binary is None:
            raise BrowserError("no chromium installed (scripts/browser_setup.sh installs it)")
        self.timeout = timeout
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._stack = ExitStack()
        self._profile = tempfile.mkdtemp(prefix="toolgym-chromium-")
        self._process = subprocess.Popen(
            [binary, *self._flags(width, height), "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: close() kills the whole tree
        )
        try:
            socket = connect(self._websocket_url(), max_size=None, open_timeout=timeout)
            self._socket = self._stack.enter_context(socket)
            self._session = self._open_page(width, height)
        except BaseException:
            self.close()
            raise

    def _flags(self, width: int, height: int) -> list[str]:
        return [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--disable-background-networking",
            "--no-first-run",
            "--no-default-browser-check",
            "--remote-debugging-port=0",
            f"--user-data-dir={self._profile}",
            f"--window-size={width},{height}",
        ]

    def _websocket_url(self) -> str:
        """`ws://127.0.0.1:<port>/devtools/browser/<id>`, from DevToolsActivePort."""
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrowserError(f"chromium exited at start (code {self._process.returncode})")
            lines = marker.read_text().split("\n") if marker.exists() else []
            if len(lines) >= 2 and lines[0].strip() and lines[1].strip():
                return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
            time.sleep(0.05)
        raise BrowserError(f"chromium wrote no DevToolsActivePort in {self.timeout} s")

    def _open_page(self, width: int, height: int) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=None)
        attached = self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, None
        )
        session = attached["sessionId"]
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(method, session=session)
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics, session)
        return session

    # -- the protocol ----------------------------------------------------------------------------
    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = ""
    ) -> dict[str, Any]:
        """Send one CDP command and return its result (to the page's session by default;
        `session=None` addresses the browser itself)."""
        message: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params or {}}
        session = self._session if session == "" else session
        if session:
            message["sessionId"] = session
        self._socket.send(json.dumps(message))
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer in {self.timeout} s")
            try:
                reply = json.loads(self._socket.recv(timeout=left))
            except TimeoutError:  # the driver's own error: wait_for goes on polling
                raise BrowserError(f"{method}: no answer in {self.timeout} s") from None
            if reply.get("id") == message["id"]:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self._note_event(reply)

    def _note_event(self, event: dict[str, Any]) -> None:
        """Keep the page's exceptions and error messages in `errors`."""
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            description = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"exception: {description}")
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
            texts = [str(arg.get("value", arg.get("description", ""))) for arg in params["args"]]
            self.errors.append("console.error: " + " ".join(texts))
        elif event.get("method") == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            if entry.get("source") != "network":  # a failed fetch: the page itself reports it
                self.errors.append(f"{entry.get('source')}: {entry.get('text')}")

    # -- what the tests use ------------------------------------------------------------------------
    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"{expression[:80]!r} raised: {text}")
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout: float | None = None) -> Any:
        """Poll a JavaScript expression until it is truthy; return its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        failure = ""
        while True:
            try:  # while a page loads, its document may not be there yet
                value = self.evaluate(condition)
            except BrowserError as error:
                value, failure = None, str(error)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(
                    f"timed out waiting for {condition!r} ({failure or 'falsy'};"
                    f" page errors: {self.errors})"
                )
            time.sleep(0.05)

    def goto(self, url: str, ready: str | None = None, timeout: float | None = None) -> None:
        """Load `url` as a new document; then wait for the JavaScript condition `ready`, if
        given (evaluated in the new document only, never in the one being left)."""
        self.evaluate("window.__leaving = true")
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        if ready:
            self.wait_for(f"!window.__leaving && ({ready})", timeout)

    def screenshot(self, path: str | Path, full_page: bool = True) -> Path:
        """Save a PNG of the page (all of it with `full_page`, else the viewport)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"]}
            params["clip"]["scale"] = 1
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """Kill the browser (its whole process group) and delete its profile."""
        self._stack.close()
        with suppress(ProcessLookupError):  # the whole group: renderers and helpers too
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=10)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
