"""Ends a local Ray whose driver died: the Ray that `RayBackend` starts for this process.

`ray.init()` without an address starts Ray's processes (GCS, raylet, dashboard, monitors)
as children of the driver, and the raylet starts its agents and workers. Ray ends them on
`ray.shutdown()` and at interpreter exit; when the driver is killed (SIGKILL, the OOM
killer) its children get a parent-death signal, but the raylet's dashboard and runtime-env
agents stay up about 60 s more (Ray 2.60: they try to report the raylet's death to the GCS,
which is gone).

`watch(session_dir)` starts a watchdog for such a Ray: a small process (standard library
only, run as a script) in a session of its own, so that a kill of the driver's process group
does not take it. Every `INTERVAL` seconds it notes the Ray processes below the driver's
(those whose command line names the session's folder, and every process below them, by
process id and start time). When the driver is gone it stops them all (SIGSTOP, so none can
start another), then kills them; when they are all gone while the driver lives (a normal
`ray.shutdown()`) it exits. A Ray this process joined (an address, `RAY_ADDRESS`, a `ray
start` cluster that `ray.init()` found) has no such children: no watchdog is started for it
and nothing of it is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

INTERVAL = 1.0
"""Seconds between the watchdog's looks at the process table (about 16 microseconds per
process on the machine where it was measured)."""


def _table() -> dict[int, tuple[int, int]]:
    """Every process: pid -> (parent pid, start time in clock ticks since boot)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def _names(pid: int, folder: str) -> bool:
    """Whether `pid`'s command line names `folder` (or a path below it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            text = cmdline.read().replace(b"\0", b" ") + b" "
    except OSError:
        return False
    needle = os.fsencode(folder.rstrip("/"))
    return needle + b"/" in text or needle + b" " in text


def session_processes(session_dir: str, parent: int | None = None) -> dict[int, int]:
    """The children of `parent` (default: this process) whose command line names
    `session_dir`: the Ray processes that `ray.init` started there (pid -> start time).
    Empty for a Ray that `parent` joined."""
    parent = os.getpid() if parent is None else parent
    table = _table()
    return {
        pid: start
        for pid, (ppid, start) in table.items()
        if ppid == parent and pid != os.getpid() and _names(pid, session_dir)
    }


def _below(known: dict[int, int], table: dict[int, tuple[int, int]]) -> dict[int, int]:
    """`known`'s processes that still live (same pid and start time), and every process
    below them."""
    found = {pid: start for pid, start in known.items() if pid in table and table[pid][1] == start}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = table[child][1]
                todo.append(child)
    return found


def _signal(pids: dict[int, int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _end(known: dict[int, int]) -> dict[int, int]:
    """Stop every process of the session (again, until no new one appears), then kill them.
    Returns what was killed."""
    stopped: dict[int, int] = {}
    for _ in range(10):
        found = _below({**known, **stopped}, _table())
        new = {pid: start for pid, start in found.items() if pid not in stopped}
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        stopped.update(new)
    _signal(stopped, signal.SIGKILL)
    return stopped


def run(driver: int, known: dict[int, int], interval: float = INTERVAL) -> int:
    """The watchdog's loop, in the process that `watch` started (a child of `driver`)."""
    while True:
        if os.getppid() != driver:  # the driver is gone: we were handed to another parent
            killed = _end(known)
            print(f"driver {driver} gone: killed {sorted(killed)}", file=sys.stderr)
            return 0
        known = _below(known, _table())
        if not known:
            return 0  # the session ended while the driver lives (ray.shutdown)
        time.sleep(interval)


def watch(session_dir: str) -> subprocess.Popen | None:
    """Start a watchdog for the Ray that this process started with `session_dir`; None (and
    nothing started) when no child of this process names it (a Ray it joined)."""
    roots = session_processes(session_dir)
    if not roots:
        return None
    command = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())]
    command += [f"{pid}:{start}" for pid, start in roots.items()]
    with contextlib.ExitStack() as stack:
        path = os.path.join(session_dir, "logs", "toolgym_watchdog.err")
        try:  # what it did, or why it failed, in the session's logs
            log: IO[bytes] | int = stack.enter_context(open(path, "ab"))
        except OSError:
            log = subprocess.DEVNULL
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
    # reap it when it exits before us
    threading.Thread(target=process.wait, name="toolgym-ray-watchdog", daemon=True).start()
    return process


def _main(arguments: list[str]) -> int:
    driver, *pairs = arguments
    known = {int(pid): int(start) for pid, start in (pair.split(":") for pair in pairs)}
    return run(int(driver), known)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


__all__ = ["INTERVAL", "run", "session_processes", "watch"]
