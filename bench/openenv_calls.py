"""Per-step overhead of an OpenEnv step against a local toolgym tool, measured in one run.

The same action, adding two numbers, four ways:

- **local**: a toolgym environment in this process (`toolgym.as_environment([add])`);
- **openenv**: an OpenEnv server (openenv-core's `create_fastapi_app` under uvicorn, in a
  process of its own on loopback) with an `AddAction(a, b)`, stepped through
  `toolgym.openenv(url)`: argument checks, openenv-core's WebSocket client, the server's
  validation and dispatch;
- **client only**: the same server stepped with openenv-core's own client
  (`GenericEnvClient(...).sync().step`), without toolgym, to split the figure;
- **toolgym serve**: openenv-core's client stepping `toolgym serve ADDER --protocol openenv`
  (the reverse direction: the same tool served by toolgym);
- **mcp stdio**: for comparison in the same run, the same tool in an MCP stdio server through
  `toolgym.mcp` (`bench/mcp_calls.py`'s server; left out without the `mcp` SDK).

Each is timed over `--calls` steps (one call a turn; `astep` for `--async` where toolgym
steps), after `--warmup` steps; the figures are the median and 99th percentile of a step, in
microseconds, and the ratio of the medians (OpenEnv / local). The cost of an episode's start
(a new instance's reset and first step: for OpenEnv a new WebSocket session) is printed too.
Figures are printed, never asserted.

    python bench/openenv_calls.py [--calls 2000] [--warmup 100] [--resets 5] [--async]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

# this script's folder is on sys.path: the add tool, its MCP server and the timers are shared
from mcp_calls import SERVER as MCP_SERVER
from mcp_calls import add, summary, timed_calls, timed_resets

import toolgym
from toolgym.adapters.mcp_session import require_sdk

SERVER = textwrap.dedent(
    '''
    import sys

    import uvicorn
    from openenv.core.env_server import Action, Environment, Observation, State
    from openenv.core.env_server import create_fastapi_app


    class AddAction(Action):
        """Add two numbers."""

        a: int
        b: int


    class AddObservation(Observation):
        result: int = 0


    class AddEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state = State(step_count=0)
            return AddObservation()

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            return AddObservation(result=action.a + action.b)

        @property
        def state(self):
            return self._state


    app = create_fastapi_app(AddEnvironment, AddAction, AddObservation, max_concurrent_envs=64)

    if __name__ == "__main__":
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    '''
)

ADDER = textwrap.dedent(
    '''
    class Adder:
        def reset(self, **kwargs):
            return None

        def add(self, a: int, b: int) -> int:
            """Add two numbers.

            Args:
                a: The first.
                b: The second.
            """
            return a + b
    '''
)


def timed_client(url: str, action: dict, calls: int, warmup: int) -> list[float]:
    """Seconds per `step` of openenv-core's own sync client."""
    from openenv.core import GenericEnvClient

    times = []
    with GenericEnvClient(base_url=url).sync() as client:
        client.reset()
        for index in range(warmup + calls):
            start = time.perf_counter()
            client.step(action)
            if index >= warmup:
                times.append(time.perf_counter() - start)
    return times


def timed_mcp(folder: str, calls: int, warmup: int, use_async: bool) -> list[float]:
    """`timed_calls` through `toolgym.mcp` over bench/mcp_calls.py's stdio server; [] without
    the mcp SDK."""
    try:
        require_sdk()
    except ImportError:
        return []
    (Path(folder) / "mcp_add.py").write_text(MCP_SERVER)
    with (
        open(os.devnull, "w") as quiet,
        toolgym.mcp([sys.executable, f"{folder}/mcp_add.py"], errlog=quiet)() as env,
    ):
        env.reset(seed=0)
        return timed_calls(env, calls, warmup, use_async)


@contextlib.contextmanager
def running(command: list[str], url: str | None = None) -> Iterator[str]:
    """Run a server until the block ends; its URL (`url`, or its first stdout line)."""
    import urllib.request

    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        url = url or process.stdout.readline().strip()
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        process.stdout.close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--resets", type=int, default=5)
    parser.add_argument("--async", dest="use_async", action="store_true", help="astep")
    args = parser.parse_args()
    n, w, use_async = args.calls, args.warmup, args.use_async

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "add_server.py").write_text(SERVER)
        (Path(folder) / "adder.py").write_text(ADDER)
        port = free_port()
        serve = [sys.executable, "-m", "toolgym", "serve", f"{folder}/adder.py:Adder"]
        with (
            running(
                [sys.executable, f"{folder}/add_server.py", str(port)], f"http://127.0.0.1:{port}"
            ) as url,
            running([*serve, "--protocol", "openenv", "--port", "0"]) as served,
        ):
            local = toolgym.as_environment([add])
            local.reset(seed=0)
            remote = toolgym.openenv(url)
            with remote() as env:
                env.reset(seed=0)
                local_times = timed_calls(local, n, w, use_async)
                openenv_times = timed_calls(env, n, w, use_async)
            client_times = timed_client(url, {"a": 2, "b": 3}, n, w)
            call = {"tool": "add", "arguments": {"a": 2, "b": 3}}
            served_times = timed_client(served, call, n, w)
            mcp_times = timed_mcp(folder, n, w, use_async)
            local_reset = timed_resets(lambda: toolgym.as_environment([add]), args.resets)
            openenv_reset = timed_resets(remote, args.resets)

    rows = [
        ("local", local_times),
        ("openenv", openenv_times),
        ("client only", client_times),
        ("toolgym serve", served_times),
        *([("mcp stdio", mcp_times)] if mcp_times else []),
    ]
    how = "astep" if use_async else "step"
    print(f"{n} steps of add(a, b) per arm, one call per {how}; microseconds per step")
    for name, times in rows:
        median, p99 = summary(times)
        print(f"  {name:<14} median {median:9.1f}   p99 {p99:9.1f}")
    ratio = summary(openenv_times)[0] / summary(local_times)[0]
    print(
        f"episode start (new instance: reset + first step): local {local_reset * 1e3:.2f} ms, "
        f"openenv {openenv_reset * 1e3:.1f} ms (a WebSocket session per instance)"
    )
    print(f"openenv / local per step: {ratio:.0f}x")


if __name__ == "__main__":
    main()
