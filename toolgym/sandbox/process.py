"""The `process` backend: each instance in its own subprocess, limited and, where possible,
walled off with bubblewrap.

What a worker gets (and reports in `RemoteEnvironment.isolation`; nothing is claimed that was
not set up):

- resource limits (setrlimit): address space, CPU seconds, open files, file size;
- no new processes: a seccomp filter makes fork/vfork/clone fail (threads still work), since
  RLIMIT_NPROC does not bind root; with `max_processes > 0` the filter is off and
  RLIMIT_NPROC applies instead (only when not running as root). An environment that declares
  `runs_model_code` gets a session zygote started before the filter, so that it can run the
  model's code in processes of its own (`toolgym.envs.python_session`), each under the filter;
- an allow-listed environment: PATH, HOME=/tmp, LANG, PYTHONPATH and toolgym's own variables,
  never the host's (no API keys or tokens);
- with bubblewrap (`apt-get install bubblewrap`): a user namespace in which the worker is uid
  65534 with no capabilities and no_new_privs; a minimal read-only view of the host (system
  libraries, the interpreter and its environment, toolgym's source, the environment's own
  module or package, `extra_paths`) with no home, no `/root`, no `/run` (no host sockets); a
  private `/tmp` of `tmp_bytes`; no network (its own network namespace, so the host's loopback
  services are unreachable too), its own PID namespace, and death with the parent. This holds
  wherever the project and its virtual environment live, `/tmp` included;
- without bubblewrap: `unshare --net` when permitted (no network), else nothing; the
  filesystem is the host's, and `isolation.notes` says so.

A worker that dies while starting reports the last lines it wrote to stderr.
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
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.sandbox.cgroups import WorkerGroup, remove_stale
from toolgym.sandbox.host_user import HostUser, become, sandbox_user, unreachable
from toolgym.sandbox.imports import TOOLGYM_SOURCE, module_root
from toolgym.sandbox.remote import Channel, Isolation, SandboxError
from toolgym.sandbox.scratch import Scratch
from toolgym.sandbox.scratch import remove_stale as remove_stale_scratch

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, not between fork and exec


@functools.cache
def _spawner() -> ThreadPoolExecutor:
    """The one long-lived thread that starts workers (made at the first start, not import)."""
    return ThreadPoolExecutor(1, thread_name_prefix="toolgym-spawn")


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
    tmp_bytes: int = 64 << 20
    """Size of the worker's private /tmp, and of its /dev/shm (with bubblewrap)."""
    tmp_inodes: int = 16384
    """Files and folders its /tmp, and its /dev/shm, may hold (with bubblewrap, when this
    process is root: `toolgym.sandbox.scratch`); empty files cost kernel memory no size
    counts."""
    total_memory_bytes: int = 2 << 30
    """Memory of the worker and everything it starts together, counting what no per-process
    limit sees: shared memory, memfds, the files of its /tmp and /dev/shm (a memory cgroup
    with no swap, where available; see `toolgym.sandbox.cgroups`). 0: no cap."""
    max_tasks: int = 256
    """Threads and processes of the worker and everything it starts (a pids cgroup, where
    this process may create one; see `toolgym.sandbox.cgroups`)."""
    cpus: float = 1.0
    """CPU share in cores (a cpu cgroup, where available); 0: no cap."""


@dataclass
class ProcessBackend:
    """Starts workers as subprocesses of this Python (`python -m toolgym.sandbox.worker`).

    Args:
        limits: Resource limits.
        bubblewrap: Use bubblewrap when installed (True) or never (False).
        extra_paths: Folders added to the worker's PYTHONPATH (this process's sys.path is
            passed already, so environments importable here are importable there).
        user: The unprivileged host account workers run as when this process is root
            (default: `toolgym-sandbox`, made by the set-up, else `nobody`; see
            `toolgym.sandbox.host_user`). Never root: where no such account can read the
            worker's view, a class that declares `runs_model_code` is refused and any other
            runs as root mapped into its namespace, with a warning and a note.
    """

    limits: ProcessLimits = field(default_factory=ProcessLimits)
    bubblewrap: bool = True
    extra_paths: list[str] = field(default_factory=list)
    user: str | None = None
    start_timeout: float = 30.0
    name: str = "process"

    def start(self, target: type | None = None) -> ProcessChannel:
        """A new worker for `target` (its module made visible), after its hello."""
        _remove_stale_leftovers()
        launch = self._launch(target)
        isolation = launch.isolation
        env = _worker_environment(self._import_roots(target), self.limits)
        if getattr(target, "runs_model_code", False):
            env["TOOLGYM_CODE_SESSIONS"] = "1"  # a zygote for sessions, started before seccomp
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (the channel closes it); explains a death at start
        group = WorkerGroup(self.limits.max_tasks, self.limits.cpus, self.limits.total_memory_bytes)
        isolation.limits.update(group.enforced)
        if "tasks" not in group.enforced:
            isolation.notes.append("no pids cgroup: threads are not limited")
        if self.limits.total_memory_bytes and "total_memory_bytes" not in group.enforced:
            isolation.notes.append(
                "no memory cgroup: shared memory, memfds and /tmp's files are not counted "
                "against a limit of the worker's"
            )

        def prepare_child() -> None:  # between fork and exec, in this order
            group.join()  # (as root: joining and mounting need it)
            if launch.scratch is not None:
                launch.scratch.mount()
            if launch.user is not None:
                become(launch.user)
            # the limits last: until exec the child still holds the host's descriptors (a few
            # per live worker), so an open-files limit set first failed the 64th start
            self._limit_child()
            _die_with_parent()  # after `become`: a change of user clears it

        # Spawned from one long-lived thread: the parent-death signal (and bubblewrap's
        # --die-with-parent) fires when the spawning *thread* exits, and rollouts start
        # workers from short-lived pool threads.
        try:
            spawner = _spawner()
            process = spawner.submit(
                subprocess.Popen,
                launch.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd="/tmp",
                preexec_fn=prepare_child,
                start_new_session=True,
            ).result()
        except (OSError, subprocess.SubprocessError) as error:
            group.remove()
            if launch.scratch is not None:
                launch.scratch.remove()
            stderr.close()
            raise SandboxError(f"the worker could not be started: {error}") from error
        channel = ProcessChannel(process, isolation, stderr, group, launch.scratch)
        hello = channel.hello(self.start_timeout)
        _record_process_limit(isolation, hello, self.limits)
        if getattr(target, "runs_model_code", False):
            for note in isolation.notes:  # a gap in what holds the model's code: never silent
                _warn_once(f"process sandbox for {getattr(target, '__qualname__', target)}: {note}")
        return channel

    def _launch(self, target: type | None) -> _Launch:
        """The command, and what the child does before it: the account it becomes and the
        scratch mounts it makes (both only when this process is root)."""
        command, isolation = self._command(target)
        if not command[0].endswith("bwrap"):
            return _Launch(command, isolation)
        root = os.getuid() == 0
        scratch = None
        if root and _scratch_mounts_work():
            scratch = Scratch(self.limits.tmp_bytes, self.limits.tmp_inodes)
            command = _with_scratch(command, scratch)
            isolation.limits["tmp_inodes"] = self.limits.tmp_inodes
        else:
            isolation.notes.append(
                "no inode limit on /tmp and /dev/shm (mounting one needs root): empty files "
                "cost kernel memory their size limit does not count"
            )
        if not root:
            isolation.user += f", mapped to host uid {os.getuid()}"
            return _Launch(command, isolation, None, scratch)
        user, problem = self._host_user(target)
        if user is None:
            if getattr(target, "runs_model_code", False):
                if scratch is not None:
                    scratch.remove()
                raise SandboxError(
                    f"refusing to run {getattr(target, '__qualname__', target)}, which runs "
                    f"the model's code, as the host's root: {problem}"
                )
            note = f"the worker runs as the host's root mapped into its namespace: {problem}"
            isolation.notes.append(note)
            _warn_once(note)
            isolation.user += ", mapped to the host's root"
        else:
            isolation.user += f", mapped to host user {user}"
        return _Launch(command, isolation, user, scratch)

    def _host_user(self, target: type | None) -> tuple[HostUser | None, str]:
        """The unprivileged account for a root host, or None and why none can serve."""
        user = sandbox_user(self.user)
        if user is None:
            return None, f"no unprivileged host account {self.user or 'toolgym-sandbox or nobody'}"
        sources = [source for source, _ in self._view(target)]
        blocked = unreachable(sources, user)
        if blocked:
            return None, (
                f"{user} cannot read {blocked}; let it in (`chmod o+x` on a folder it must pass "
                "through, `o+rx` on one it must read; `make sandboxes` does this for the "
                "interpreter, the virtual environment and the project) or name another "
                "account with ProcessBackend(user=...)"
            )
        if not _works((shutil.which("bwrap") or "bwrap", *_BWRAP_PROBE, "--", "true"), user):
            return None, f"bubblewrap does not start as {user} (no unprivileged user namespaces?)"
        return user, ""

    def _view(self, target: type | None) -> list[tuple[str, str]]:
        return _read_only_view(self._import_roots(target), target, self.extra_paths)

    def _command(self, target: type | None) -> tuple[list[str], Isolation]:
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
        if bwrap and _works((bwrap, *_BWRAP_PROBE, "--", "true")):
            isolation.network, isolation.filesystem = False, "minimal read-only view"
            isolation.user = "uid 65534 in a user namespace, no capabilities, no_new_privs"
            isolation.limits["tmp_bytes"] = limits.tmp_bytes
            arguments = _bwrap_arguments(self._view(target), limits.tmp_bytes)
            return [bwrap, *arguments, "--", *worker], isolation
        isolation.notes.append(
            "bubblewrap unavailable: the worker sees the host's files with the user's rights"
        )
        unshare = shutil.which("unshare")
        if unshare and _works((unshare, "--net", "true")):
            isolation.network = False
            return [unshare, "--net", "--", *worker], isolation
        isolation.notes.append("no network namespace available: the worker has the network")
        return worker, isolation

    def _import_roots(self, target: type | None) -> list[str]:
        """The folders the worker imports from: `extra_paths`, the one holding the
        environment's module or package, the one holding toolgym, and the interpreter's own
        (site-packages and the standard library)."""
        roots = [*self.extra_paths]
        module = module_root(target)
        if module is not None:
            roots.append(str(module.parent))
        roots.append(str(TOOLGYM_SOURCE.parent))
        roots += [entry for entry in sys.path if entry and _inside_interpreter(entry)]
        return list(dict.fromkeys(roots))

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


@dataclass
class _Launch:
    command: list[str]
    isolation: Isolation
    user: HostUser | None = None
    scratch: Scratch | None = None


def _die_with_parent() -> None:
    """The parent-death signal (the worker dies with us, even without bubblewrap)."""
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _with_scratch(command: list[str], scratch: Scratch) -> list[str]:
    """bubblewrap's arguments with the scratch mounts bound in place of its own tmpfs."""
    replaced = []
    for source, path in ((scratch.shm, "/dev/shm"), (scratch.tmp, "/tmp")):
        at = next(i for i in range(len(command) - 3) if command[i + 2 : i + 4] == ["--tmpfs", path])
        replaced.append((at, ["--bind", str(source), path]))
    for at, arguments in sorted(replaced, reverse=True):
        command = [*command[:at], *arguments, *command[at + 4 :]]
    return command


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


@functools.cache
def _scratch_mounts_work() -> bool:
    """Whether this process may mount the scratch tmpfs in a child (asked once)."""
    scratch = Scratch(1 << 20, 64)
    try:
        return subprocess.run(["true"], preexec_fn=scratch.mount, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        scratch.remove()


_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Files under /etc that programs read and that hold no secrets.
_ETC = (
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/nsswitch.conf",
)
_HOSTS = Path(__file__).with_name("hosts")
"""The worker's /etc/hosts (localhost and its own name: not the host's names)."""
_BWRAP_PROBE = ("--unshare-user", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--unshare-net")


def _bwrap_arguments(binds: list[tuple[str, str]], tmp_bytes: int) -> list[str]:
    """bubblewrap's arguments: namespaces (no nested user namespaces: model code cannot gain
    capabilities in one of its own), no capabilities, the read-only view (`(source, path)`
    pairs), a private /tmp and /dev/shm of `tmp_bytes` each, a read-only /dev, and a read-only
    root (bubblewrap's own tmpfs) over it all."""
    arguments = [
        "--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534",
        "--cap-drop", "ALL",
        "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        # --as-pid-1: no bubblewrap init inside, which would hold the protocol pipes where
        # the model's code could open them (/proc/1/fd); the worker is PID 1 and untraceable
        "--as-pid-1", "--die-with-parent", "--new-session", "--hostname", "sandbox",
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(tmp_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", str(tmp_bytes), "--tmpfs", "/tmp",
    ]  # fmt: skip
    for source, path in binds:  # after /tmp: a project or venv under /tmp is bound over it
        arguments += ["--ro-bind", source, path]
    arguments += ["--ro-bind", str(_HOSTS), "/etc/hosts"]
    return [*arguments, "--remount-ro", "/", "--chdir", "/tmp"]


def _read_only_view(
    roots: list[str], target: type | None, extra: list[str]
) -> list[tuple[str, str]]:
    """What the worker may read, as `(source, path)` binds: system folders, harmless /etc
    files, the interpreter (every hop of its symlink chain, and the base interpreter a venv
    points to), toolgym, the environment's module or package, and the `extra` folders the
    user named (at the path given, even when it is a symlink)."""
    named = [(str(Path(p).resolve()), os.path.abspath(p)) for p in extra if os.path.exists(p)]
    paths = [p for p in (*_SYSTEM, *_ETC) if os.path.exists(p)]
    paths += [str(hop.parent) for hop in _symlink_chain(Path(sys.executable))]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths.append(str(Path(prefix).resolve()))
        paths.append(prefix)
    paths.append(str(TOOLGYM_SOURCE))
    module = module_root(target)
    if module is not None:
        paths.append(str(module))
    paths += [root for root in roots if _inside_interpreter(root)]
    existing = [p for p in dict.fromkeys(paths) if os.path.exists(p)]
    return [(p, p) for p in _outermost(existing)] + named


def _symlink_chain(path: Path) -> list[Path]:
    """`path` and every path its symlinks lead through (a venv's python -> a tool's python ->
    the real interpreter)."""
    chain = [path]
    while chain[-1].is_symlink() and len(chain) < 40:
        target = Path(os.readlink(chain[-1]))
        chain.append(target if target.is_absolute() else chain[-1].parent / target)
    return chain


def _inside_interpreter(path: str) -> bool:
    """Whether a sys.path entry belongs to the interpreter (stdlib, site-packages)."""
    resolved = str(Path(path).resolve())
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return any(
        resolved.startswith(str(Path(p).resolve()) + os.sep) or resolved == p for p in prefixes
    )


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths inside another one of the list (binding the outer one covers them)."""
    ordered = sorted(paths, key=len)
    kept: list[str] = []
    for path in ordered:
        if not any(path == k or path.startswith(k.rstrip(os.sep) + os.sep) for k in kept):
            kept.append(path)
    return kept


def _worker_environment(roots: list[str], limits: ProcessLimits) -> dict[str, str]:
    """The worker's whole environment: nothing from the host's but the locale."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PYTHONPATH": os.pathsep.join(roots),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONSAFEPATH": "1",  # not the working folder (/tmp, writable) on the import path
    }
    if limits.max_processes == 0:
        env["TOOLGYM_NO_NEW_PROCESSES"] = "1"
    return env


@functools.cache
def _remove_stale_leftovers() -> None:
    """Once per process: empty cgroups and scratch folders of workers whose host process
    died."""
    remove_stale()
    remove_stale_scratch()


@functools.cache
def _works(command: tuple[str, ...], user: HostUser | None = None) -> bool:
    """Whether a probe command succeeds, as `user` if given (asked once per process, not per
    worker)."""
    preexec = None if user is None else functools.partial(become, user)
    try:
        return (
            subprocess.run(command, capture_output=True, timeout=10, preexec_fn=preexec).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
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
    """The worker's stdin/stdout pipes (and its stderr, kept in a file)."""

    def __init__(
        self,
        process: subprocess.Popen,
        isolation: Isolation,
        stderr: Any = None,
        group: WorkerGroup | None = None,
        scratch: Scratch | None = None,
    ) -> None:
        super().__init__()
        self.process, self.isolation, self._stderr = process, isolation, stderr
        self._group, self._scratch = group, scratch
        assert process.stdin is not None and process.stdout is not None
        self._out = process.stdout.fileno()
        os.set_blocking(self._out, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._out, selectors.EVENT_READ)

    def _write(self, data: bytes, timeout: float) -> None:
        assert self.process.stdin is not None
        fd = self.process.stdin.fileno()
        os.set_blocking(fd, False)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as writable:
            writable.register(fd, selectors.EVENT_WRITE)
            while data:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not writable.select(remaining):
                    raise TimeoutError
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    continue

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
        if self._group is not None:
            self._group.remove()
        if self._scratch is not None:
            self._scratch.remove()
            self._scratch = None
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self._selector.get_map() is not None:
            self._selector.close()
        if self._stderr is not None:
            self._stderr.close()

    def exit_description(self) -> str:
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "stream closed"
        why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        tail = self.stderr_tail()
        return f"{why}; its stderr ended with: {tail}" if tail else why

    def stderr_tail(self, characters: int = 1500) -> str:
        """The last characters the worker wrote to stderr."""
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - characters))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""


__all__ = ["ProcessBackend", "ProcessChannel", "ProcessLimits", "SandboxError"]
