"""The `process` backend: each instance in its own subprocess, limited and, where possible,
walled off with bubblewrap.

What a worker gets (and reports in `RemoteEnvironment.isolation`; nothing is claimed that was
not set up):

- resource limits (setrlimit): address space, CPU seconds, open files, file size;
- no new processes: a seccomp filter makes fork/vfork/clone fail (threads still work), since
  RLIMIT_NPROC does not bind root; with `max_processes > 0` the filter is off and
  RLIMIT_NPROC applies instead (only when not running as root);
- with bubblewrap (`apt-get install bubblewrap`): no network (a new network namespace, so the
  host's loopback services are unreachable too), the host's files read-only, a private
  /tmp, its own PID namespace, and death with the parent;
- without bubblewrap: `unshare --net` when permitted (no network), else nothing; the
  filesystem is the host's, and `isolation.notes` says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from toolgym.sandbox.remote import Channel, Isolation, SandboxError

_PR_SET_PDEATHSIG = 1
_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="toolgym-spawn")


@dataclass
class ProcessLimits:
    """Resource limits of one worker process."""

    memory_bytes: int = 1 << 30
    """Address-space limit (RLIMIT_AS); an allocation beyond it raises MemoryError."""
    cpu_seconds: int = 300
    """CPU time before the kernel kills the worker (RLIMIT_CPU); tool calls also time out."""
    open_files: int = 256
    """File descriptors (RLIMIT_NOFILE)."""
    file_bytes: int = 64 << 20
    """Largest file the worker may write (RLIMIT_FSIZE)."""
    max_processes: int = 0
    """0: no new processes at all (seccomp). N > 0: RLIMIT_NPROC = N (ignored for root)."""


@dataclass
class ProcessBackend:
    """Starts workers as subprocesses of this Python (`python -m toolgym.sandbox.worker`).

    Args:
        limits: Resource limits.
        bubblewrap: Use bubblewrap when installed (True) or never (False).
        extra_paths: Folders added to the worker's PYTHONPATH (this process's sys.path is
            passed already, so environments importable here are importable there).
    """

    limits: ProcessLimits = field(default_factory=ProcessLimits)
    bubblewrap: bool = True
    extra_paths: list[str] = field(default_factory=list)
    start_timeout: float = 30.0
    name: str = "process"

    def start(self, target: type | None = None) -> ProcessChannel:
        command, isolation = self._command()
        env = {
            **os.environ,
            "TOOLGYM_WORKER": "1",
            "PYTHONPATH": os.pathsep.join([*self.extra_paths, *filter(None, sys.path)]),
            "PYTHONUNBUFFERED": "1",
        }
        if self.limits.max_processes == 0:
            env["TOOLGYM_NO_NEW_PROCESSES"] = "1"
        # Spawned from one long-lived thread: the parent-death signal (and bubblewrap's
        # --die-with-parent) fires when the spawning *thread* exits, and rollouts start
        # workers from short-lived pool threads.
        process = _SPAWNER.submit(
            subprocess.Popen,
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd="/tmp",
            preexec_fn=self._limit_child,
            start_new_session=True,
        ).result()
        channel = ProcessChannel(process, isolation)
        hello = channel.hello(self.start_timeout)
        _record_process_limit(isolation, hello, self.limits)
        return channel

    def _command(self) -> tuple[list[str], Isolation]:
        limits = self.limits
        isolation = Isolation(
            backend="process",
            limits={
                "memory_bytes": limits.memory_bytes,
                "cpu_seconds": limits.cpu_seconds,
                "open_files": limits.open_files,
                "file_bytes": limits.file_bytes,
            },
            user=f"uid {os.getuid()}",
        )
        worker = [sys.executable, "-m", "toolgym.sandbox.worker"]
        bwrap = shutil.which("bwrap") if self.bubblewrap else None
        if bwrap and _works((bwrap, "--ro-bind", "/", "/", "--unshare-net", "true")):
            isolation.network, isolation.filesystem = False, "read-only"
            return [bwrap, *_BWRAP_ARGS, "--", *worker], isolation
        isolation.notes.append(
            "bubblewrap unavailable: the worker sees the host's files with the user's rights"
        )
        unshare = shutil.which("unshare")
        if unshare and _works((unshare, "--net", "true")):
            isolation.network = False
            return [unshare, "--net", "--", *worker], isolation
        isolation.notes.append("no network namespace available: the worker has the network")
        return worker, isolation

    def _limit_child(self) -> None:
        """Runs in the child between fork and exec."""
        limits = self.limits
        for kind, value in (
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_CPU, limits.cpu_seconds),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_FSIZE, limits.file_bytes),
        ):
            resource.setrlimit(kind, (value, value))
        if limits.max_processes > 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes,) * 2)
        with contextlib.suppress(OSError, AttributeError):  # dies with us, even without bwrap
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_BWRAP_ARGS = [
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--proc", "/proc",
    "--tmpfs", "/tmp",
    "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
    "--die-with-parent", "--new-session",
    "--chdir", "/tmp",
]  # fmt: skip


@functools.cache
def _works(command: tuple[str, ...]) -> bool:
    """Whether a probe command succeeds (asked once per process, not per worker)."""
    try:
        return subprocess.run(command, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _record_process_limit(isolation: Isolation, hello: dict, limits: ProcessLimits) -> None:
    if limits.max_processes == 0:
        if hello.get("no_new_processes"):
            isolation.limits["processes"] = 0
        isolation.notes.extend(hello.get("notes", []))
    elif os.getuid() != 0:
        isolation.limits["processes"] = limits.max_processes
    else:
        isolation.notes.append("RLIMIT_NPROC does not bind root: processes are not limited")


class ProcessChannel(Channel):
    """The worker's stdin/stdout pipes."""

    def __init__(self, process: subprocess.Popen, isolation: Isolation) -> None:
        super().__init__()
        self.process, self.isolation = process, isolation
        assert process.stdin is not None and process.stdout is not None
        self._out = process.stdout.fileno()
        os.set_blocking(self._out, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._out, selectors.EVENT_READ)

    def _write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def _read(self, timeout: float) -> bytes:
        if not self._selector.select(timeout):
            raise TimeoutError
        try:
            return os.read(self._out, 1 << 16)
        except BlockingIOError:
            return self._read(timeout)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self._selector.get_map() is not None:
            self._selector.close()

    def exit_description(self) -> str:
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "stream closed"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


__all__ = ["ProcessBackend", "ProcessChannel", "ProcessLimits", "SandboxError"]
