"""A Ray that toolgym starts for a trainer (`RayBackend().connect()` without an address) does
not outlive the trainer: after a SIGKILL of the driver no process of its Ray session is left
(Ray 2.60 alone leaves the raylet's dashboard and runtime-env agents up for about 60 s);
`ray.shutdown()` ends the session and its watchdog while the driver lives; and the watchdog
signals only processes below the driver, never a Ray the driver joined
(`toolgym.sandbox.ray_watchdog`). Every test ends what it started, by process id.

The Ray tests skip with the reason when Ray is not installed, unless
TOOLGYM_REQUIRE_SANDBOXES=1; the watchdog's own tests need only Linux's /proc.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolgym.sandbox import ray_watchdog

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"
try:
    import ray  # noqa: F401 (only whether it is there)

    NO_RAY = ""
except ImportError as error:
    if REQUIRED:
        raise
    NO_RAY = f"Ray is not installed ({error}; pip install 'toolgym[ray]')"

LOOPBACK = "127.0.0.2"
"""The node's address, as in `test_ray_backend.py` (loopback, not the literal 127.0.0.1)."""
GRACE = 30.0
"""Seconds the session's processes get to be gone after their driver was killed."""

DRIVER = """
import os, sys, time
import toolgym
from toolgym.sandbox.ray_backend import RayBackend

tmp, mode = sys.argv[1], sys.argv[2]
backend = RayBackend(
    inner="local", resources={"num_cpus": 0},
    init_options={"_temp_dir": tmp, "_node_ip_address": sys.argv[3]},
)
ray = backend.connect()
env = toolgym.make("Wordle-v0", sandbox=backend)  # an actor and its inner worker
env.reset(seed=0, answer="crane")
print("ready", os.path.realpath(os.path.join(tmp, "session_latest")), flush=True)
if mode == "shutdown":
    sys.stdin.readline()
    env.close()
    ray.shutdown()
    print("down", flush=True)
sys.stdin.readline()
"""

FAKE_DRIVER = """
import subprocess, sys, time
from toolgym.sandbox.ray_watchdog import watch

session, seconds = sys.argv[1], sys.argv[2]
# a "raylet" naming the session, which starts an "agent" that does not name it
code = "import subprocess, sys, time; agent = subprocess.Popen([sys.executable, '-c', " \\
    "'import time; time.sleep(300)']); print(agent.pid, flush=True); time.sleep(float(sys.argv[1]))"
head = subprocess.Popen(
    [sys.executable, "-c", code, seconds, session + "/logs"], stdout=subprocess.PIPE, text=True
)
agent = int(head.stdout.readline())
print("watchdog", watch(session).pid, head.pid, agent, flush=True)
head.wait()
sys.stdin.readline()
"""


def _table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent, start time, state) for every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0].decode())
    return table


def _tree(root: int) -> dict[int, int]:
    """`root` and every process below it (pid -> start time)."""
    table = _table()
    found, todo = {root: table[root][1]}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, start, _) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _alive(processes: dict[int, int]) -> dict[int, int]:
    """Those of `processes` that still run (same pid and start time, not a zombie)."""
    table = _table()
    return {
        pid: start
        for pid, start in processes.items()
        if pid in table and table[pid][1] == start and table[pid][2] != "Z"
    }


def _naming(folder: str) -> dict[int, int]:
    """Processes whose command line or environment names `folder` (orphans included)."""
    found, needle = {}, folder.encode()
    for pid, (_, start, state) in _table().items():
        if pid == os.getpid() or state == "Z":
            continue
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/cmdline").read_bytes()
            text += Path(f"/proc/{pid}/environ").read_bytes()
            if needle in text:
                found[pid] = start
    return found


def _kill(processes: dict[int, int]) -> None:
    for pid in _alive(processes):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(processes: dict[int, int], seconds: float) -> dict[int, int]:
    """Wait until none of `processes` runs; what still runs after `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := _alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _describe(processes: dict[int, int]) -> list[str]:
    described = []
    for pid in processes:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            described.append(f"{pid}: {command[:100].decode(errors='replace')}")
    return described


class Driver:
    """A trainer process (`code` run with `arguments`), its output read line by line."""

    def __init__(self, code: str, *arguments: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.seen: dict[int, int] = {self.process.pid: _tree(self.process.pid)[self.process.pid]}

    def expect(self, word: str) -> list[int | str]:
        """The words after `word` on the first line that starts with it (numbers as ints)."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.split()[:1] == [word]:
                self.seen.update(_tree(self.process.pid))
                return [int(w) if w.isdigit() else w for w in line.split()[1:]]
        raise AssertionError(f"the driver ended (status {self.process.wait()}) before {word!r}")

    def send(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        """Kill the driver and everything seen below it (the test's cleanup)."""
        _kill(self.seen)
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    """A short temp folder for one Ray session (socket paths), and its environment."""
    if NO_RAY:
        pytest.skip(NO_RAY)
    tmp = tempfile.mkdtemp(prefix="tgl", dir="/tmp")
    try:
        yield tmp
    finally:
        _kill(_naming(tmp))
        shutil.rmtree(tmp, ignore_errors=True)


def _ray_driver(tmp: str, mode: str) -> Driver:
    # HOME: a local Ray writes ~/.ray/auth_token (Ray 2.60 turns token authentication on),
    # and a later `ray start` in the real home would then refuse drivers that join by address
    env = {**os.environ, "RAY_TMPDIR": tmp, "HOME": os.path.join(tmp, "home")}
    env.pop("RAY_ADDRESS", None)
    return Driver(DRIVER, tmp, mode, LOOPBACK, env=env)


@pytest.mark.slow
def test_a_killed_driver_leaves_no_ray_process(ray_tmp):
    driver = _ray_driver(ray_tmp, "kill")
    try:
        (session,) = driver.expect("ready")
        commands = " ".join(_describe(driver.seen))
        for part in ("raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"):
            assert part in commands, (part, commands)  # what Ray alone leaves up, included
        session_processes = {**driver.seen, **_naming(str(session))}
        driver.process.send_signal(signal.SIGKILL)
        driver.process.wait()
        left = _wait_gone(session_processes, GRACE)
        assert not left, f"left after {GRACE:.0f} s: {_describe(left)}"
        assert not _naming(str(session)), _describe(_naming(str(session)))
    finally:
        driver.stop()


@pytest.mark.slow
def test_ray_shutdown_ends_the_session_and_its_watchdog(ray_tmp):
    driver = _ray_driver(ray_tmp, "shutdown")
    try:
        driver.expect("ready")
        ours = {pid: start for pid, start in driver.seen.items() if pid != driver.process.pid}
        commands = " ".join(_describe(ours))
        assert "ray_watchdog.py" in commands and "ray-dashboard-" not in commands  # no dashboard
        driver.send()
        driver.expect("down")
        left = _wait_gone(ours, GRACE)
        assert not left, f"left after ray.shutdown(): {_describe(left)}"
        assert driver.process.poll() is None  # the driver lives on
        driver.send()
        assert driver.process.wait(timeout=60) == 0
    finally:
        driver.stop()


def _fake_session(tmp_path: Path, name: str) -> str:
    session = str(tmp_path / name)
    os.makedirs(session + "/logs")
    return session


def test_the_watchdog_kills_only_what_is_below_the_driver(tmp_path):
    session = _fake_session(tmp_path, "session_x")
    # a process the driver did not start (a cluster it joined) naming the same session
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", session])
    driver = Driver(FAKE_DRIVER, session, "300")
    try:
        watchdog, head, agent = driver.expect("watchdog")
        below = {pid: start for pid, start in driver.seen.items() if pid != driver.process.pid}
        assert below.keys() == {watchdog, head, agent}
        driver.process.send_signal(signal.SIGKILL)
        driver.process.wait()
        left = _wait_gone(below, 10 * ray_watchdog.INTERVAL)
        assert not left, _describe(left)
        assert foreign.poll() is None  # untouched
        log = Path(session, "logs", "toolgym_watchdog.err").read_text()
        assert f"driver {driver.process.pid} gone: killed [{min(head, agent)}" in log
    finally:
        driver.stop()
        foreign.kill()
        foreign.wait()


def test_the_watchdog_leaves_when_the_session_ends_first(tmp_path):
    session = _fake_session(tmp_path, "session_y")
    driver = Driver(FAKE_DRIVER, session, "1")  # its "raylet" ends after a second
    try:
        watchdog, head, agent = driver.expect("watchdog")
        assert isinstance(watchdog, int) and isinstance(head, int) and isinstance(agent, int)
        seen = driver.seen
        assert not _wait_gone({head: seen[head]}, 30)
        time.sleep(2 * ray_watchdog.INTERVAL)  # the "agent" outlives it: still watched
        assert _alive({watchdog: seen[watchdog]})
        _kill({agent: seen[agent]})  # the last process of the session ends
        assert not _wait_gone({watchdog: seen[watchdog]}, 10 * ray_watchdog.INTERVAL)
        assert driver.process.poll() is None
    finally:
        driver.stop()


def test_a_ray_this_process_joined_is_never_watched(tmp_path):
    session = str(tmp_path / "session_z")
    # a joined cluster's processes are not this process's children (here: an orphan)
    code = "import subprocess as s, sys; print(s.Popen(sys.argv[1:], stdout=s.DEVNULL, "
    code += "stderr=s.DEVNULL).pid)"
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)", session + "/logs"]
    started = subprocess.run(
        [sys.executable, "-c", code, *sleeper], capture_output=True, text=True, check=True
    )
    orphan = int(started.stdout)
    try:
        assert ray_watchdog.session_processes(session) == {}
        assert ray_watchdog.watch(session) is None  # nothing started
        assert not [line for line in _describe(_tree(os.getpid())) if "ray_watchdog" in line]
        assert _alive({orphan: _table()[orphan][1]})  # and nothing signalled
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
