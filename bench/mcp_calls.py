"""Per-call overhead of an MCP stdio tool against a local toolgym tool, measured in one run.

The same tool, `add(a, b)`, three ways:

- **local**: a toolgym environment in this process (`toolgym.as_environment([add])`);
- **mcp stdio**: the same function in an MCP server (the SDK's `MCPServer`) run as a stdio
  subprocess, through `toolgym.mcp(...)`: argument checks, the JSON-RPC round trip over pipes,
  the server's own dispatch;
- **sdk only**: the same server called with `MCPSession.call` (the SDK's client, without
  toolgym's stepping), to split the MCP figure into the SDK's and toolgym's parts.

Each is timed over `--calls` calls of `step` (one call a turn; `astep` for `--async`), after
`--warmup` calls; the figures are the median and 99th percentile of a call, in microseconds,
and the ratio of the medians (MCP / local). The cost of an episode's start is printed too:
`reset` of the local environment against a fresh server process (MCP: a process per episode).
Figures are printed, never asserted.

    python bench/mcp_calls.py [--calls 2000] [--warmup 100] [--resets 5] [--async]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import toolgym
from toolgym.adapters.mcp_session import MCPSession

SERVER = textwrap.dedent(
    '''
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("bench", log_level="ERROR")


    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b


    if __name__ == "__main__":
        app.run()
    '''
)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def timed_calls(env, calls: int, warmup: int, use_async: bool) -> list[float]:
    """Seconds per `step` (or `astep`, all in one event loop) of one `add` call, after
    `warmup` untimed ones."""
    call = toolgym.ToolCall("add", {"a": 2, "b": 3})

    async def steps() -> list[float]:
        times = []
        for index in range(warmup + calls):
            start = time.perf_counter()
            result = await env.astep(call) if use_async else env.step(call)
            elapsed = time.perf_counter() - start
            if result.messages[0]["content"] != "5":
                raise RuntimeError(f"unexpected result {result.messages}")
            if index >= warmup:
                times.append(elapsed)
        return times

    return asyncio.run(steps())


def timed_sdk(session: MCPSession, calls: int, warmup: int) -> list[float]:
    times = []
    for index in range(warmup + calls):
        start = time.perf_counter()
        session.call("add", {"a": 2, "b": 3})
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> tuple[float, float]:
    """(median, p99) in microseconds."""
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e6, p99 * 1e6


def timed_resets(make, resets: int) -> float:
    """Median seconds of `reset` on a fresh instance (a process start for stdio)."""
    times = []
    for _ in range(resets):
        env = make()
        start = time.perf_counter()
        env.reset(seed=0)
        env.step(toolgym.ToolCall("add", {"a": 1, "b": 1}))  # the episode's first call too
        times.append(time.perf_counter() - start)
        env.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--resets", type=int, default=5)
    parser.add_argument("--async", dest="use_async", action="store_true", help="astep")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder, open(os.devnull, "w") as quiet:
        server = Path(folder) / "add_server.py"
        server.write_text(SERVER)
        command = [sys.executable, str(server)]
        local = toolgym.as_environment([add])
        local.reset(seed=0)
        remote = toolgym.mcp(command, errlog=quiet)
        mcp_env = remote()
        mcp_env.reset(seed=0)
        try:
            local_times = timed_calls(local, args.calls, args.warmup, args.use_async)
            mcp_times = timed_calls(mcp_env, args.calls, args.warmup, args.use_async)
            sdk_times = timed_sdk(mcp_env.executor.session, args.calls, args.warmup)
        finally:
            mcp_env.close()
        local_reset = timed_resets(lambda: toolgym.as_environment([add]), args.resets)
        mcp_reset = timed_resets(remote, args.resets)

    rows = [("local", local_times), ("mcp stdio", mcp_times), ("sdk only", sdk_times)]
    how = "astep" if args.use_async else "step"
    print(f"{args.calls} calls of add(a, b) per arm, one call per {how}; microseconds per call")
    for name, times in rows:
        median, p99 = summary(times)
        print(f"  {name:<10} median {median:9.1f}   p99 {p99:9.1f}")
    ratio = summary(mcp_times)[0] / summary(local_times)[0]
    print(
        f"episode start (reset + first call): local {local_reset * 1e3:.2f} ms, "
        f"mcp stdio {mcp_reset * 1e3:.0f} ms (a server process per episode)"
    )
    print(f"mcp stdio / local per call: {ratio:.1f}x")


if __name__ == "__main__":
    main()
