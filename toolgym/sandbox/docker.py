"""The `docker` backend: one long-lived container per instance, through the docker SDK.

Each container runs the worker (`toolgym/sandbox/boot.py`, then the worker) and requests
travel over its attached stdin/stdout (no `exec` per call). Containers start with no network,
a read-only root, a private /tmp (tmpfs), memory / pids / CPU / open-files / pending-signal
limits, all capabilities dropped, no-new-privileges, and a host uid of their own
(`toolgym.sandbox.identities`: the same pool as the process backend's, so per-user kernel
counters are never shared between containers). The toolgym source (and the module of an
environment defined outside it) is bind-mounted read-only at fixed paths and is the worker's
whole import path beside the standard library (checked by the worker before it starts); the
host's load, uptime, memory and CPU counters in /proc are replaced by the container's own.
The image holds only Debian's python3, so it never needs rebuilding when the code changes.

The image is built offline (no registry): `debootstrap` of Debian bookworm with python3 from
Debian's archive, `docker import`, then a `docker build` layer on top (`build_image()`, about
a minute; the result is reused). Every container carries the label `toolgym.sandbox` and its
owner (host boot id and PID); the first backend started in a process removes containers whose
owner is dead, and an exit handler removes this process's own.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import select
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.sandbox.identities import Identity, acquire, pool_range
from toolgym.sandbox.imports import TOOLGYM_SOURCE, module_root
from toolgym.sandbox.remote import Channel, Isolation, SandboxError
from toolgym.sandbox.view import BOOT, proc_masks

IMAGE = "toolgym-sandbox:1"
BASE_IMAGE = "toolgym-sandbox-base:bookworm"
LABEL = "toolgym.sandbox"
OWNER_LABEL = "toolgym.sandbox.owner"
SOURCE_MOUNT = "/opt/toolgym"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
_DOCKERFILE = f"""FROM {BASE_IMAGE}
RUN mkdir -p {SOURCE_MOUNT} /opt/code
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65534:65534
WORKDIR /tmp
"""


# Address space beyond the container's memory for thread stacks and allocator arenas, which
# reserve virtual memory they mostly never touch.
_THREAD_MARGIN = 512 << 20


def client(timeout: int = 60) -> Any:
    """A docker SDK client from the environment (DOCKER_HOST or the local socket)."""
    try:
        import docker
    except ImportError as error:
        raise SandboxError(
            "the docker backend needs the docker SDK: pip install 'toolgym[docker]'"
        ) from error
    try:
        return docker.from_env(timeout=timeout)
    except docker.errors.DockerException as error:
        raise SandboxError(f"no Docker daemon answers: {error}") from error


def docker_ready(image: str = IMAGE) -> bool:
    """True when a daemon answers and `image` is built."""
    try:
        docker_client = client(timeout=5)
        docker_client.ping()
        docker_client.images.get(image)
        return True
    except Exception:
        return False


def build_image(rebuild: bool = False, mirror: str = DEBIAN_MIRROR, log=print) -> str:
    """Build the sandbox image offline if it is missing (or `rebuild`); returns its tag.

    Needs root, `debootstrap` (apt-get install debootstrap) and Debian's archive.
    """
    docker_client = client(timeout=600)
    if not rebuild and _has_image(docker_client, IMAGE):
        return IMAGE
    if rebuild or not _has_image(docker_client, BASE_IMAGE):
        _import_base(docker_client, mirror, log)
    log(f"building {IMAGE} on {BASE_IMAGE}")
    docker_client.images.build(fileobj=io.BytesIO(_DOCKERFILE.encode()), tag=IMAGE, rm=True)
    return IMAGE


def _import_base(docker_client: Any, mirror: str, log) -> None:
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise SandboxError(
            "building the sandbox image needs debootstrap (apt-get install debootstrap)"
        )
    with tempfile.TemporaryDirectory(prefix="toolgym-rootfs-") as folder:
        rootfs, tarball = Path(folder) / "rootfs", Path(folder) / "rootfs.tar"
        log(f"debootstrap bookworm (python3) from {mirror} ...")
        subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                "--include=python3",
                "bookworm",
                str(rootfs),
                mirror,
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        repository, tag = BASE_IMAGE.split(":")
        log(f"docker import -> {BASE_IMAGE}")
        docker_client.api.import_image_from_file(str(tarball), repository=repository, tag=tag)


def _has_image(docker_client: Any, name: str) -> bool:
    import docker

    try:
        docker_client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


@dataclass
class DockerLimits:
    """Resource limits of one container."""

    memory_bytes: int = 512 << 20
    """Memory (and memory + swap) limit; the kernel kills the worker beyond it."""
    pids: int = 64
    """Processes and threads in the container."""
    cpus: float = 1.0
    """CPU share (cores)."""
    tmp_bytes: int = 64 << 20
    """Size of the writable /tmp (tmpfs), and of /dev/shm."""
    tmp_inodes: int = 16384
    """Files and folders /tmp and /dev/shm may hold each (empty files cost kernel memory
    their size does not count)."""
    open_files: int = 1024
    """File descriptors (RLIMIT_NOFILE); also the most its uid may have in flight in
    SCM_RIGHTS messages."""
    pending_signals: int = 1024
    """Signals queued to its processes (RLIMIT_SIGPENDING)."""
    message_queue_bytes: int = 800 << 10
    """POSIX message-queue bytes (RLIMIT_MSGQUEUE), for an environment whose `sandbox_allow`
    names "message_queues" (refused by the seccomp filter otherwise)."""


@dataclass
class DockerBackend:
    """Starts each worker in its own container.

    Args:
        image: The image (see `build_image`).
        limits: Resource limits.
        code_paths: Extra host folders mounted read-only (at `/opt/code/N`) and put on the
            worker's import path (the environment's module is mounted at `/opt/module`).
        uids: The pool of host uids, one per live container (see `toolgym.sandbox.identities`
            for the default and how it is chosen).
    """

    image: str = IMAGE
    limits: DockerLimits = field(default_factory=DockerLimits)
    code_paths: list[str] = field(default_factory=list)
    uids: range | None = None
    start_timeout: float = 60.0
    name: str = "docker"

    def start(self, target: type | None = None) -> DockerChannel:
        """A new container running the worker for `target`, after its hello."""
        from toolgym.sandbox.process import _sandbox_allow

        allowed = _sandbox_allow(target)
        docker_client = client()
        reap_orphans(docker_client)
        identity = acquire(self.uids)
        try:
            return self._start(docker_client, target, identity, allowed)
        except BaseException:
            identity.release()
            raise

    def _start(
        self, docker_client: Any, target: type | None, identity: Identity, allowed: list[str]
    ) -> DockerChannel:
        """Create the container, attach to its stdin/stdout, start it and wait for its hello
        (a container that fails to start is removed)."""
        container = _create(
            docker_client, self.image, **self._container_options(target, identity, allowed)
        )
        _register_exit_handler()  # at the first container, not at import
        _started.add(container.id)
        try:
            stream = container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
            container.start()
        except Exception as error:
            _remove(container)
            raise SandboxError(f"could not start a sandbox container: {error}") from error
        channel = DockerChannel(container, stream, self._isolation(identity), identity)
        channel.hello(self.start_timeout)
        return channel

    def _container_options(
        self, target: type | None, identity: Identity, allowed: list[str]
    ) -> dict[str, Any]:
        """`containers.create`'s options: the boot command, no network, a read-only root,
        the limits (memory, pids, CPU, ulimits, tmpfs sizes), the host uid, no capabilities,
        the read-only mounts and the worker's environment, the owner labels."""
        import docker

        mounts, paths = self._mounts(target)
        limits = self.limits
        ulimits = [
            docker.types.Ulimit(name=name, soft=value, hard=value)
            for name, value in (
                ("nofile", limits.open_files),
                ("sigpending", limits.pending_signals),
                ("msgqueue", limits.message_queue_bytes),
            )
        ]
        environment = {
            "TOOLGYM_SYS_PATH": ":".join(paths),
            "TOOLGYM_CHECK_SYS_PATH": "1",
            "TOOLGYM_PRIVATE_TMP": "1",  # the container's own: a snapshot carries it
            # a REPL's image, held by its session and the worker within the one memory limit
            "TOOLGYM_IMAGE_BYTES": str(limits.memory_bytes // 8),
            # the worker limits its own address space to this, so that an allocation past
            # the container's memory is a MemoryError the model reads, not an OOM kill
            "TOOLGYM_MEMORY_BYTES": str(limits.memory_bytes + _THREAD_MARGIN),
        }
        if allowed:
            environment["TOOLGYM_SECCOMP_ALLOW"] = ",".join(allowed)
        return dict(
            command=["python3", "-I", "-S", "-B", "-u", BOOT],
            stdin_open=True,
            network_mode="none",
            read_only=True,
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,
            pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            ulimits=ulimits,
            user=f"{identity.uid}:{identity.gid}",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            tmpfs={
                path: f"size={limits.tmp_bytes},nr_inodes={limits.tmp_inodes},mode=1777"
                for path in ("/tmp", "/dev/shm")
            },
            hostname="sandbox",
            volumes=mounts,
            environment=environment,
            working_dir="/tmp",
            labels={LABEL: "1", OWNER_LABEL: _owner()},
            auto_remove=True,
            # the worker silences itself after its hello; this caps what comes before
            log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
        )

    def _mounts(self, target: type | None) -> tuple[dict[str, dict[str, str]], list[str]]:
        """Read-only mounts (the `toolgym` package alone, `code_paths`, the environment's module
        file or package, never the folder around either) and the PYTHONPATH entries they make."""
        mounts = {str(TOOLGYM_SOURCE): {"bind": f"{SOURCE_MOUNT}/toolgym", "mode": "ro"}}
        paths = [SOURCE_MOUNT]
        for path, source in _proc_files(self.limits).items():
            mounts[source] = {"bind": path, "mode": "ro"}
        for index, host_path in enumerate(self.code_paths):
            inside = f"/opt/code/{index}"
            mounts[host_path] = {"bind": inside, "mode": "ro"}
            paths.append(inside)
        root = module_root(target)
        if root is not None:
            mounts[str(root)] = {"bind": f"/opt/module/{root.name}", "mode": "ro"}
            paths.append("/opt/module")
        return mounts, paths

    def _isolation(self, identity: Identity) -> Isolation:
        limits = self.limits
        uids = pool_range(self.uids)
        return Isolation(
            backend="docker",
            network=False,
            filesystem="image",
            limits={
                "memory_bytes": limits.memory_bytes,
                "processes": limits.pids,
                "cpus": limits.cpus,
                "tmp_bytes": limits.tmp_bytes,
                "tmp_inodes": limits.tmp_inodes,
                "open_files": limits.open_files,
                "pending_signals": limits.pending_signals,
                "message_queue_bytes": limits.message_queue_bytes,
            },
            user=(
                f"host uid {identity.uid} (its own, from the pool {uids.start}-"
                f"{uids.stop - 1}), no capabilities"
            ),
        )


class DockerChannel(Channel):
    """The container's attached stdin/stdout (docker's multiplexed stream, demultiplexed)."""

    def __init__(
        self, container: Any, stream: Any, isolation: Isolation, identity: Identity | None = None
    ) -> None:
        super().__init__()
        self.container, self.isolation = container, isolation
        self.identity = identity
        """The host uid the container runs as, held until `kill` has removed it."""
        self._socket: socket.socket = getattr(stream, "_sock", stream)
        self._socket.setblocking(False)
        self._raw = b""
        self._dead = False

    def _closed(self) -> bool:
        """Killed meanwhile (another thread: a pool's watchdog, a close)."""
        return self._dead or self._socket.fileno() < 0

    def _write(self, data: bytes, timeout: float) -> None:
        if self._closed():
            raise OSError("the container's stream is closed")
        self._socket.settimeout(timeout)  # raises TimeoutError when the worker stops reading
        try:
            self._socket.sendall(data)
        finally:
            self._socket.setblocking(False)

    def _read(self, timeout: float) -> bytes:
        """Payload bytes of the next stdout frame(s) (8-byte headers: stream, size)."""
        while True:
            if len(self._raw) >= 8:
                kind, size = struct.unpack(">BxxxL", self._raw[:8])
                if len(self._raw) >= 8 + size:
                    payload, self._raw = self._raw[8 : 8 + size], self._raw[8 + size :]
                    if kind == 1 and payload:
                        return payload
                    continue
            if self._closed():
                raise OSError("the container's stream is closed")
            ready, _, _ = select.select([self._socket], [], [], timeout)
            if not ready:
                raise TimeoutError
            try:
                chunk = self._socket.recv(1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return b""
            self._raw += chunk

    @property
    def alive(self) -> bool:
        return not self._dead

    def kill(self) -> None:
        if self._dead:
            return
        self._dead = True
        with contextlib.suppress(OSError):
            self._socket.close()
        _remove(self.container)
        if self.identity is not None:  # removed: no process runs as its uid any more
            self.identity.release()

    def exit_description(self) -> str:
        try:
            logs = self.container.logs(stdout=False, stderr=True, tail=20)
            tail = logs.decode("utf-8", "replace").strip()[-1500:]
        except Exception:  # already removed (auto_remove)
            tail = ""
        try:
            result = self.container.wait(timeout=2)
            code = result.get("StatusCode")
            why = "killed (memory limit?)" if code == 137 else f"exit code {code}"
        except Exception:
            why = "container stopped"
        return f"{why}; its stderr ended with: {tail}" if tail else why


# -- ownership and reaping ------------------------------------------------------------------
_started: set[str] = set()
_reaped = threading.Event()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def _host_id() -> str:
    """This machine: its machine id where there is one, else its host name."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            text = Path(path).read_text().strip()
            if text:
                return text
    return socket.gethostname()


def _start_time(pid: int) -> str:
    """When process `pid` started (clock ticks since boot; tells a reused pid apart)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return fields[19] if len(fields) > 19 else ""


def _pid_namespace() -> str:
    """This process's PID namespace (two trainers in containers on one host share host and
    boot ids, but not this)."""
    try:
        return os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        return ""


def _owner(pid: int | None = None) -> str:
    """The label naming a container's owner: host, boot, PID namespace, pid and the pid's
    start time."""
    pid = pid or os.getpid()
    return f"{_host_id()}:{_boot_id()}:{_pid_namespace()}:{pid}:{_start_time(pid)}"


def owner_is_dead(label: str) -> bool:
    """Whether the process named by an owner label is gone. Containers of other machines (a
    shared DOCKER_HOST) are never judged dead: their owners cannot be seen from here."""
    parts = label.split(":")
    if len(parts) != 5:
        return False  # an unknown or older label: leave it alone
    host, boot, namespace, pid, started = parts
    if host != _host_id():
        return False
    if boot != _boot_id():
        return True  # this machine rebooted since
    if namespace != _pid_namespace():
        return False  # another container's processes: not ours to judge
    if not pid.isdigit() or not _pid_alive(int(pid)):
        return True
    now = _start_time(int(pid))
    return bool(now) and now != started  # the pid now belongs to another process


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans(docker_client: Any | None = None, force: bool = False) -> int:
    """Remove sandbox containers whose owning process on this machine is gone (once per
    process unless `force`); returns how many were removed."""
    if _reaped.is_set() and not force:
        return 0
    _reaped.set()
    docker_client = docker_client or client()
    removed = 0
    for container in docker_client.containers.list(
        all=True, filters={"label": LABEL}, ignore_removed=True
    ):
        if owner_is_dead(container.labels.get(OWNER_LABEL, "")):
            _remove(container)
            removed += 1
    return removed


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):  # already gone (auto_remove), or no daemon
        container.remove(force=True)
    _started.discard(container.id)


@functools.cache
def _register_exit_handler() -> None:
    atexit.register(_remove_own_containers)


def _remove_own_containers() -> None:
    """At exit: remove the containers this process started."""
    if not _started:
        return
    try:
        docker_client = client(timeout=10)
        for container in docker_client.containers.list(
            all=True, filters={"label": f"{OWNER_LABEL}={_owner()}"}, ignore_removed=True
        ):
            _remove(container)
    except Exception:
        pass


def _create(docker_client: Any, image: str, **options: Any) -> Any:
    """`containers.create`, with Docker's errors (a missing image, a refused option) as a
    SandboxError that names the cause."""
    import docker

    try:
        return docker_client.containers.create(image, **options)
    except docker.errors.ImageNotFound as error:
        raise SandboxError(
            f"the sandbox image {image!r} does not exist here; build it with "
            f"toolgym.sandbox.docker.build_image() (make sandboxes): {error}"
        ) from error
    except docker.errors.DockerException as error:
        raise SandboxError(f"docker could not create a sandbox container: {error}") from error


_DOCKER_MAY_MOUNT = ("/proc/diskstats",)
"""Hidden /proc files that Docker (runc) lets a mount cover; the others stay the host's."""
_PROC_FILES: dict[str, str] = {}
_PROC_LOCK = threading.Lock()


def _proc_files(limits: DockerLimits) -> dict[str, str]:
    """Host files (made once per content, in a folder of this process's) that replace the
    container's /proc counters of the whole host: load, uptime, memory (its limit), CPU time.
    Docker mounts over these /proc files (as it does for LXCFS); the others stay the host's."""
    shown, hidden = proc_masks(limits.memory_bytes, limits.cpus)
    shown.update({path: b"" for path in hidden if path in _DOCKER_MAY_MOUNT})
    files = {}
    with _PROC_LOCK:
        for path, data in shown.items():
            key = f"{path}:{hash(data)}"
            if key not in _PROC_FILES or not os.path.exists(_PROC_FILES[key]):
                folder = _proc_folder()
                name = f"{len(os.listdir(folder))}-{Path(path).name}"
                target = os.path.join(folder, name)
                with open(target, "wb") as stream:
                    stream.write(data)
                os.chmod(target, 0o444)
                _PROC_FILES[key] = target
            files[path] = _PROC_FILES[key]
    return files


@functools.cache
def _proc_folder() -> str:
    folder = tempfile.mkdtemp(prefix="toolgym-docker-proc-")
    os.chmod(folder, 0o755)
    atexit.register(shutil.rmtree, folder, True)
    return folder
