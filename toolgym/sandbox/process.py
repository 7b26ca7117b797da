"""The `process` backend: each instance in its own subprocess, limited and, where possible,
walled off with bubblewrap.

What a worker gets (and reports in `RemoteEnvironment.isolation`; nothing is claimed that was
not set up):

- resource limits (setrlimit): address space, CPU seconds, open files, file size, pending
  signals, POSIX message-queue bytes;
- no new processes: a seccomp filter makes fork/vfork/clone fail (threads still work), since
  RLIMIT_NPROC does not bind root; with `max_processes > 0` the filter is off and
  RLIMIT_NPROC applies instead (only when not running as root). An environment that declares
  `runs_model_code` gets a session zygote started before the filter, so that it can run the
  model's code in processes of its own (`toolgym.sandbox.python_session`), each under the filter;
- an allow-listed environment: PATH, HOME=/tmp, LANG and toolgym's own variables, never the
  host's (no API keys or tokens);
- an import path the host chose (`toolgym/sandbox/boot.py`): toolgym, the environment's
  module and `extra_paths` at fixed read-only paths (`toolgym.sandbox.view`), then the
  interpreter's own entries; under bubblewrap the worker refuses to start if the sandbox could
  write any of it;
- with bubblewrap (`apt-get install bubblewrap`): a user namespace in which the worker is uid
  65534 with no capabilities and no_new_privs; a minimal read-only view of the host (system
  libraries, the interpreter and its environment, toolgym, the environment's own module or
  package, `extra_paths`) with no home, no `/root`, no `/run` (no host sockets); a private
  `/tmp` and `/dev/shm` of `tmp_bytes`; host-wide /proc counters (load, memory, CPU time,
  pressure, ...) replaced by its own; no network (its own network namespace, so the host's
  loopback services are unreachable too), its own PID and IPC namespaces, and death with the
  parent. When this process is root, each worker runs as a host uid of its own
  (`toolgym.sandbox.identities`), so no per-user kernel counter is shared between workers, and
  the folders it reads are staged by root (`toolgym.sandbox.scratch`), so a project anywhere,
  a private home folder or `/tmp` included, works without opening any folder to other
  accounts;
- without bubblewrap: `unshare --net` when permitted (no network), else nothing; the
  filesystem is the host's, and `isolation.notes` says so. A class that runs the model's code
  is refused there unless `allow_unsandboxed=True`.

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
from typing import Any

from toolgym.sandbox.cgroups import WorkerGroup, remove_stale
from toolgym.sandbox.host_user import HostUser, become, sandbox_user, unreachable
from toolgym.sandbox.identities import Identity, acquire, pool_range
from toolgym.sandbox.imports import TOOLGYM_SOURCE
from toolgym.sandbox.python_session import OPTIONAL_RULES
from toolgym.sandbox.remote import Channel, Isolation, SandboxError
from toolgym.sandbox.scratch import Scratch
from toolgym.sandbox.scratch import remove_stale as remove_stale_scratch
from toolgym.sandbox.view import BOOT, Bind, guards, host_sys_path, proc_masks, worker_view

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
    """File descriptors (RLIMIT_NOFILE); also the most descriptors its host uid may have in
    flight in SCM_RIGHTS messages."""
    file_bytes: int = 64 << 20
    """Largest file the worker may write (RLIMIT_FSIZE)."""
    pending_signals: int = 1024
    """Signals queued to the worker and its sessions (RLIMIT_SIGPENDING)."""
    message_queue_bytes: int = 800 << 10
    """POSIX message-queue bytes (RLIMIT_MSGQUEUE; Linux's default), for an environment whose
    `sandbox_allow` names "message_queues" (refused by the seccomp filter otherwise)."""
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
    """Starts workers as subprocesses of this Python (`toolgym/sandbox/boot.py`, then the
    worker).

    Args:
        limits: Resource limits.
        bubblewrap: Use bubblewrap when installed (True) or never (False).
        extra_paths: Folders put on the worker's import path (bound read-only at
            `/opt/code/N`); the interpreter's site-packages, toolgym and the environment's own
            module or package are there already.
        user: One unprivileged host account for every worker when this process is root
            (their per-user kernel counters are then shared). Default: a host uid of its own
            per worker, from `uids`.
        uids: The pool of host uids for workers of a root host (see
            `toolgym.sandbox.identities` for the default and how it is chosen).
        allow_unsandboxed: Run a class that declares `runs_model_code` without bubblewrap
            (with the user's rights and files, as root on a root host). Refused otherwise.
    """

    limits: ProcessLimits = field(default_factory=ProcessLimits)
    bubblewrap: bool = True
    extra_paths: list[str] = field(default_factory=list)
    user: str | None = None
    uids: range | None = None
    allow_unsandboxed: bool = False
    start_timeout: float = 30.0
    name: str = "process"

    def start(self, target: type | None = None) -> ProcessChannel:
        """A new worker for `target` (its module made visible), after its hello."""
        _remove_stale_leftovers()
        launch = self._launch(target)
        try:
            return self._spawn(target, launch)
        except BaseException:
            launch.release()
            raise

    def _spawn(self, target: type | None, launch: _Launch) -> ProcessChannel:
        isolation = launch.isolation
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
            process = (
                _spawner()
                .submit(
                    subprocess.Popen,
                    launch.command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    env=launch.env,
                    cwd="/tmp",
                    preexec_fn=prepare_child,
                    start_new_session=True,
                    pass_fds=launch.pass_fds,
                )
                .result()
            )
        except (OSError, subprocess.SubprocessError) as error:
            group.remove()
            stderr.close()
            raise SandboxError(f"the worker could not be started: {error}") from error
        finally:
            launch.close_data()
        channel = ProcessChannel(process, isolation, stderr, group, launch.scratch, launch.identity)
        launch.scratch = launch.identity = None  # the channel's now
        hello = channel.hello(self.start_timeout)
        _record_process_limit(isolation, hello, self.limits)
        if getattr(target, "runs_model_code", False):
            for note in isolation.notes:  # a gap in what holds the model's code: never silent
                _warn_once(f"process sandbox for {getattr(target, '__qualname__', target)}: {note}")
        return channel

    def _launch(self, target: type | None) -> _Launch:
        """The command, its environment, and what the child does before it: the host
        identity it becomes and the mounts it makes (both only when this process is root)."""
        allowed = _sandbox_allow(target)
        bwrap = shutil.which("bwrap") if self.bubblewrap else None
        if not (bwrap and _works((bwrap, *_BWRAP_PROBE, "--", "true"))):
            return self._unsandboxed(target, allowed, bwrap_asked=self.bubblewrap)
        isolation = Isolation(
            backend="process",
            network=False,
            filesystem="minimal read-only view",
            limits=self._limit_report(),
            user="uid 65534 in a user namespace, no capabilities, no_new_privs",
        )
        isolation.limits["tmp_bytes"] = self.limits.tmp_bytes
        view = worker_view(target, self.extra_paths)
        launch = _Launch([], isolation, _worker_environment(view.sys_path, self.limits, allowed))
        launch.env["TOOLGYM_CHECK_SYS_PATH"] = "1"
        launch.env["TOOLGYM_PRIVATE_TMP"] = "1"  # bubblewrap's tmpfs: a snapshot carries it
        _code_sessions(launch.env, target)
        try:
            self._choose_identity(target, launch, view.binds)
            arguments = self._bwrap_arguments(view.binds, launch)
            launch.command = [bwrap, *arguments, "--", *_python(BOOT)]
        except BaseException:
            launch.release()
            raise
        return launch

    def _choose_identity(self, target: type | None, launch: _Launch, binds: list[Bind]) -> None:
        """As root: the host identity the worker becomes, and the scratch mounts that stage
        its view. Refuses a class that runs the model's code where no identity can serve."""
        isolation = launch.isolation
        root = os.getuid() == 0
        _plan_scratch(launch, self.limits, root)
        if not root:
            isolation.user += f", mapped to host uid {os.getuid()}"
            isolation.notes.append(
                f"every worker runs as this host's own uid {os.getuid()} (one host identity "
                "per worker needs root): per-user kernel counters (descriptors in flight, "
                "inotify instances, pipe buffers, pending signals) are shared between workers"
            )
            return
        problem = _pick_host_user(launch, self.user, self.uids)
        if launch.user is not None:
            problem = _host_user_problem(launch, binds)
        _settle_identity(target, launch, problem, self.uids)

    def _bwrap_arguments(self, binds: list[Bind], launch: _Launch) -> list[str]:
        """bubblewrap's arguments: namespaces (no nested user namespaces: model code cannot
        gain capabilities in one of its own), no capabilities, a private /tmp and /dev/shm
        (the scratch mounts, else bubblewrap's tmpfs), read-only tmpfs guards over the top
        folders under them that binds pass through, the read-only view (staged, as root),
        the /proc counters of its own, and a read-only root (bubblewrap's own tmpfs)."""
        limits, scratch = self.limits, launch.scratch
        arguments = [
            "--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534",
            "--cap-drop", "ALL",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try",
            # --as-pid-1: no bubblewrap init inside, which would hold the protocol pipes where
            # the model's code could open them (/proc/1/fd); the worker is PID 1 and untraceable
            "--as-pid-1", "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--proc", "/proc", "--dev", "/dev",
        ]  # fmt: skip
        for path, mount in (("/dev/shm", "shm"), ("/tmp", "tmp")):
            if scratch is not None:
                arguments += ["--bind", str(getattr(scratch, mount)), path]
            else:
                arguments += ["--size", str(limits.tmp_bytes), "--tmpfs", path]
            if path == "/dev/shm":
                arguments += ["--remount-ro", "/dev"]
        tops = guards(binds)
        for top in tops:  # a project or venv under /tmp: nothing beside it is writable
            arguments += ["--size", str(1 << 20), "--tmpfs", top]
        for bind in binds:
            source = bind.source
            if scratch is not None and not bind.system:
                source = scratch.stage(source)
            arguments += ["--ro-bind", source, bind.dest]
        for top in tops:
            arguments += ["--remount-ro", top]
        shown, hidden = proc_masks(limits.total_memory_bytes or limits.memory_bytes, limits.cpus)
        for path, data in shown.items():
            arguments += ["--ro-bind-data", str(launch.data_fd(data)), path]
        for path in hidden:
            arguments += ["--ro-bind", "/dev/null", path]
        return [*arguments, "--remount-ro", "/", "--chdir", "/tmp"]

    def _unsandboxed(self, target: type | None, allowed: list[str], bwrap_asked: bool) -> _Launch:
        """A worker without bubblewrap (the host's files with the user's rights): refused for
        a class that runs the model's code unless `allow_unsandboxed`."""
        why = "bubblewrap=False" if not bwrap_asked else "bubblewrap is not available here"
        if getattr(target, "runs_model_code", False) and not self.allow_unsandboxed:
            who = "as the host's root" if os.getuid() == 0 else "with the user's rights and files"
            raise SandboxError(
                f"refusing to run {getattr(target, '__qualname__', target)}, which runs the "
                f"model's code, without bubblewrap ({why}): its code would run {who}. Install "
                "bubblewrap (make sandboxes), use the docker backend, or allow it explicitly "
                "with ProcessBackend(bubblewrap=False, allow_unsandboxed=True) (Ray: "
                "inner=ProcessBackend(bubblewrap=False, allow_unsandboxed=True))"
            )
        isolation = Isolation("process", limits=self._limit_report(), user=f"uid {os.getuid()}")
        isolation.notes.append(
            f"bubblewrap unavailable ({why}): the worker sees the host's files with the "
            "user's rights"
        )
        env = _worker_environment(host_sys_path(target, self.extra_paths), self.limits, allowed)
        _code_sessions(env, target)
        worker = _python(str(TOOLGYM_SOURCE / "sandbox" / "boot.py"))
        unshare = shutil.which("unshare")
        if unshare and _works((unshare, "--net", "true")):
            isolation.network = False
            return _Launch([unshare, "--net", "--", *worker], isolation, env)
        isolation.notes.append("no network namespace available: the worker has the network")
        return _Launch(worker, isolation, env)

    def _limit_report(self) -> dict[str, Any]:
        limits = self.limits
        return {
            "memory_bytes": limits.memory_bytes,
            "cpu_seconds": limits.cpu_seconds,
            "open_files": limits.open_files,
            "file_bytes": limits.file_bytes,
            "pending_signals": limits.pending_signals,
            "message_queue_bytes": limits.message_queue_bytes,
        }

    def _limit_child(self) -> None:
        """Runs in the child between fork and exec (after `become`: a limit can only be
        lowered, so one above this process's hard limit stays at that)."""
        limits = self.limits
        for kind, value in (
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_CPU, limits.cpu_seconds),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_FSIZE, limits.file_bytes),
            (resource.RLIMIT_SIGPENDING, limits.pending_signals),
            (resource.RLIMIT_MSGQUEUE, limits.message_queue_bytes),
        ):
            hard = resource.getrlimit(kind)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(kind, (value, value))
        if limits.max_processes > 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes,) * 2)


@dataclass
class _Launch:
    """What one worker's start needs, and what it holds until the channel takes over."""

    command: list[str]
    isolation: Isolation
    env: dict[str, str]
    user: HostUser | None = None
    identity: Identity | None = None
    scratch: Scratch | None = None
    data: list[int] = field(default_factory=list)
    """Read ends of pipes whose bytes bubblewrap copies into files (`--ro-bind-data`)."""

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return tuple(self.data)

    def data_fd(self, data: bytes) -> int:
        """A descriptor bubblewrap reads `data` from (a pipe, written and closed here)."""
        read, write = os.pipe()
        try:
            os.write(write, data)  # small: far below a pipe's buffer
        finally:
            os.close(write)
        self.data.append(read)
        return read

    def close_data(self) -> None:
        for fd in self.data:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.data = []

    def release_identity(self) -> None:
        if self.identity is not None:
            self.identity.release()
            self.identity = None

    def release(self) -> None:
        """Everything held, when the worker never started."""
        self.close_data()
        self.release_identity()
        if self.scratch is not None:
            self.scratch.remove()
            self.scratch = None


def _plan_scratch(launch: _Launch, limits: ProcessLimits, root: bool) -> None:
    """The scratch mounts that stage the worker's view and hold its /tmp and /dev/shm with
    an inode limit (as root, where mounting works); otherwise a note that no inode limit
    holds."""
    if root and _scratch_mounts_work():
        launch.scratch = Scratch(limits.tmp_bytes, limits.tmp_inodes)
        launch.isolation.limits["tmp_inodes"] = limits.tmp_inodes
    else:
        launch.isolation.notes.append(
            "no inode limit on /tmp and /dev/shm (mounting one needs root): empty files "
            "cost kernel memory their size limit does not count"
        )


def _pick_host_user(launch: _Launch, user: str | None, uids: range | None) -> str:
    """As root: the host account the worker becomes, set on `launch`: the named `user` (one
    for every worker, noted), else a host uid of its own from the pool `uids` (held by
    `launch`). Returns why none could be had ("" when one was)."""
    if user is None:
        launch.identity = acquire(uids)
        launch.user = launch.identity.user
        return ""
    launch.user = sandbox_user(user)
    if launch.user is None:
        return f"no unprivileged host account {user}"
    launch.isolation.notes.append(
        f"every worker runs as the host account {launch.user}: per-user kernel "
        "counters are shared between workers"
    )
    return ""


def _host_user_problem(launch: _Launch, binds: list[Bind]) -> str:
    """Why `launch.user` cannot serve the worker: a folder of its view it cannot read (only
    the folder's own bits when the view is staged, every folder on the way otherwise), or
    bubblewrap not starting as it. "" when it can."""
    assert launch.user is not None
    sources = [bind.source for bind in binds if not bind.system]
    staged = launch.scratch is not None
    blocked = unreachable(sources, launch.user, ancestors=not staged)
    if blocked:
        return f"{launch.user} cannot read {blocked}" + (
            " (only the folder's own permission bits matter: other accounts must be "
            "able to read it)"
            if staged
            else "; let it in (`chmod o+x` on a folder it must pass through) or run "
            "where root may mount (the view is then staged, nothing needs opening)"
        )
    if not _unprivileged_bwrap_works(launch.user, pooled=launch.identity is not None):
        return f"bubblewrap does not start as {launch.user} (no unprivileged user namespaces?)"
    return ""


def _settle_identity(
    target: type | None, launch: _Launch, problem: str, uids: range | None
) -> None:
    """As root: the identity chosen, written into the isolation report; or, where `problem`
    left none, the identity given back and the worker run as the host's root mapped into its
    namespace (noted and warned), refused for a class that runs the model's code."""
    isolation = launch.isolation
    if problem:
        launch.release_identity()
        launch.user = None
        if getattr(target, "runs_model_code", False):
            raise SandboxError(
                f"refusing to run {getattr(target, '__qualname__', target)}, which runs "
                f"the model's code, as the host's root: {problem}"
            )
        note = f"the worker runs as the host's root mapped into its namespace: {problem}"
        isolation.notes.append(note)
        _warn_once(note)
        isolation.user += ", mapped to the host's root"
    elif launch.identity is not None:
        pool = pool_range(uids)
        isolation.user += (
            f", mapped to host uid {launch.identity.uid} (its own, from the pool "
            f"{pool.start}-{pool.stop - 1})"
        )
    else:
        isolation.user += f", mapped to host user {launch.user}"


def _python(script: str) -> list[str]:
    """The interpreter on `script`, isolated: no site (no `.pth` files), no PYTHON*
    variables, no working folder on the path, no bytecode written, unbuffered."""
    return [sys.executable, "-I", "-S", "-B", "-u", script]


def _sandbox_allow(target: type | None) -> list[str]:
    """The seccomp refusals `target` lifts (its `sandbox_allow`), checked."""
    allowed = list(getattr(target, "sandbox_allow", ()) or ())
    unknown = sorted(set(allowed) - set(OPTIONAL_RULES))
    if unknown:
        raise SandboxError(
            f"{getattr(target, '__qualname__', target)}.sandbox_allow names {unknown}; known: "
            f"{', '.join(sorted(OPTIONAL_RULES))}"
        )
    return allowed


def _code_sessions(env: dict[str, str], target: type | None) -> None:
    if getattr(target, "runs_model_code", False):
        env["TOOLGYM_CODE_SESSIONS"] = "1"  # a zygote for sessions, started before seccomp


def _die_with_parent() -> None:
    """The parent-death signal (the worker dies with us, even without bubblewrap)."""
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


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


_BWRAP_PROBE = ("--unshare-user", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--unshare-net")


def _worker_environment(
    sys_path: list[str], limits: ProcessLimits, allowed: list[str]
) -> dict[str, str]:
    """The worker's whole environment: nothing from the host's but the locale."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TOOLGYM_SYS_PATH": os.pathsep.join(sys_path),
    }
    if allowed:
        env["TOOLGYM_SECCOMP_ALLOW"] = ",".join(allowed)
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


_pool_probe: list[bool] = []


def _unprivileged_bwrap_works(user: HostUser, pooled: bool) -> bool:
    """Whether bubblewrap starts as `user`: once per process for the pool's identities (the
    first one answers for all), once per named account."""
    probe = (shutil.which("bwrap") or "bwrap", *_BWRAP_PROBE, "--", "true")
    if not pooled:
        return _works(probe, user)
    if not _pool_probe:
        _pool_probe.append(_works(probe, user))
    return _pool_probe[0]


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
        identity: Identity | None = None,
    ) -> None:
        super().__init__()
        self.process, self.isolation, self._stderr = process, isolation, stderr
        self._group, self._scratch = group, scratch
        self.identity = identity
        """The host uid the worker runs as (held until `kill`), when this process is root."""
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
        view = memoryview(data)  # no copies of what is left (a snapshot may be large)
        with selectors.DefaultSelector() as writable:
            writable.register(fd, selectors.EVENT_WRITE)
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not writable.select(remaining):
                    raise TimeoutError
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    continue

    def _read(self, timeout: float) -> bytes:
        if self._selector.get_map() is None:  # killed meanwhile (another thread)
            raise OSError("the worker's stream is closed")
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
        if self.identity is not None:  # after the wait: the uid's next worker finds none alive
            self.identity.release()
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
