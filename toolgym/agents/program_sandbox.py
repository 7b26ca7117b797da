"""Agent programs in bubblewrap (`command_program(argv, sandbox="process")`): the program and
everything it starts (code the model wrote that it runs included) see a read-only view of the
host, write only a private `/tmp`, and reach one thing on the network: the endpoint.

What a sandboxed program gets:

- a user namespace in which it is uid 65534, no capabilities, no_new_privs, no nested user
  namespaces; its own PID, IPC, UTS and network namespaces, a new terminal session (no
  keystrokes pushed into the user's terminal); death with its parent;
- a read-only root of system folders (`/usr`, `/lib`, ...), harmless `/etc` files, a
  `/etc/hosts` of its own, this Python interpreter and its environment, and what the caller
  names: `paths` (folders), `cwd`, and the files the command line names (at their own paths),
  nothing else of the host (no home, no `/root`, no `/run`, no project beside it); a private
  `/tmp` and `/dev/shm` of `tmp_bytes`;
- as a root host, a host uid of its own from the sandbox pool (`toolgym.sandbox.identities`),
  its view staged by bind mounts (`toolgym.sandbox.scratch`), as process-backend workers get;
- the endpoint at its usual address: `OPENAI_BASE_URL` (`http://127.0.0.1:PORT/v1`) is served
  inside the network namespace by `toolgym.agents.program_relay`, which carries each
  connection to a Unix socket bound into the sandbox from a private host folder, and the host
  side here carries it on to the endpoint. No other address answers: not the internet, not
  the host's other loopback services (other endpoints, Ray, a Docker socket).

What it does not get (left to the operator): resource limits beyond the episode's timeout
(memory, processes, CPU: run the trainer in a cgroup or container to bound them), the
seccomp filter of environment workers (programs start interpreters and processes), and the
host-wide /proc counters hidden from workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from toolgym.sandbox.host_user import HostUser, become, unreachable
from toolgym.sandbox.remote import SandboxError
from toolgym.sandbox.scratch import Scratch

RELAY = Path(__file__).with_name("program_relay.py")
RELAY_MOUNT = "/opt/toolgym-relay"
SOCKET_MOUNT = "/run/toolgym-endpoint"
_PROBE = ("--unshare-user", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--unshare-net")


@dataclass
class ProgramSandbox:
    """How a command program is sandboxed (see the module docstring).

    Args:
        paths: Folders the program reads (bound read-only at their own paths): its code, its
            `node_modules`, an interpreter outside `/usr`. The files the command line names
            and `cwd` are bound without being listed here.
        tmp_bytes: Size of the private `/tmp` and of `/dev/shm`.
        tmp_inodes: Files each of them may hold (enforced where this process is root).
    """

    paths: Sequence[str] = field(default_factory=tuple)
    tmp_bytes: int = 64 << 20
    tmp_inodes: int = 16384

    def __post_init__(self) -> None:
        self.paths = tuple(str(path) for path in self.paths)
        missing = [path for path in self.paths if not os.path.exists(path)]
        if missing:
            raise ValueError(f"ProgramSandbox: {', '.join(missing)} does not exist")
        if bubblewrap() is None:
            raise SandboxError(
                'command_program(..., sandbox="process") needs bubblewrap, which does not run '
                "here (apt-get install bubblewrap; make sandboxes)"
            )

    @contextlib.asynccontextmanager
    async def launch(
        self, argv: list[str], cwd: str | None, base_url: str
    ) -> AsyncIterator[tuple[list[str], Callable[[], None] | None]]:
        """The command line that runs `argv` in this sandbox and what its child does before
        it (root only), while the endpoint relay for `base_url` serves; everything is
        released on exit."""
        endpoint = urlsplit(base_url)
        host, port = endpoint.hostname or "127.0.0.1", endpoint.port or 80
        folder = Path(tempfile.mkdtemp(prefix="toolgym-program-"))
        identity, scratch, server = None, None, None
        try:
            user: HostUser | None = None
            if os.getuid() == 0:
                from toolgym.sandbox.identities import acquire

                identity = acquire()
                user = identity.user
                scratch = Scratch(self.tmp_bytes, self.tmp_inodes)
            socket_path = folder / "endpoint.sock"
            server = await asyncio.start_unix_server(
                lambda r, w: _carry(r, w, host, port), path=str(socket_path)
            )
            if user is not None:  # only the program's uid (and root) may reach the socket
                os.chown(folder, user.uid, user.gid)
                os.chown(socket_path, user.uid, user.gid)
            os.chmod(socket_path, 0o600)
            binds = self._binds(argv, cwd, folder)
            if user is not None:
                staged = [source for source, _, system in binds if not system]
                blocked = unreachable(staged, user, ancestors=False)
                if blocked:
                    raise SandboxError(
                        f"the sandboxed program's uid cannot read {blocked}: other accounts "
                        "must be able to read it (its own permission bits)"
                    )
            command = [*self._arguments(binds, cwd, scratch), "--"]
            command += [sys.executable, "-I", f"{RELAY_MOUNT}/{RELAY.name}"]
            command += [f"{SOCKET_MOUNT}/{socket_path.name}", str(port), "--", *argv]
            yield command, None if user is None else _dropping(scratch, user)
        finally:
            if server is not None:
                server.close()
                with contextlib.suppress(Exception):
                    await server.wait_closed()
            if scratch is not None:
                scratch.remove()
            if identity is not None:
                identity.release()
            shutil.rmtree(folder, ignore_errors=True)

    def _binds(self, argv: list[str], cwd: str | None, folder: Path) -> list[tuple[str, str, bool]]:
        """(host source, sandbox path, system folder) for every read-only bind."""
        from toolgym.sandbox.view import ETC, HOSTS, SYSTEM, outermost, symlink_chain

        binds = [(p, p, True) for p in (*SYSTEM, *ETC) if os.path.exists(p)]
        own = [str(hop.parent) for hop in symlink_chain(Path(sys.executable))]
        for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
            own += [str(Path(prefix).resolve()), prefix]
        own += [*self.paths, *([cwd] if cwd else [])]
        own += [os.path.abspath(word) for word in argv if os.path.isfile(word)]
        program = shutil.which(argv[0])  # an interpreter outside the system folders
        if program is not None and not program.startswith(tuple(f"{s}/" for s in SYSTEM)):
            own += [str(hop) for hop in symlink_chain(Path(program))]
        own = [os.path.abspath(p) for p in dict.fromkeys(own) if os.path.exists(p)]
        binds += [(p, p, False) for p in outermost(own)]
        binds.append((str(HOSTS), "/etc/hosts", False))  # in toolgym's folder: staged
        binds.append((str(RELAY), f"{RELAY_MOUNT}/{RELAY.name}", False))
        binds.append((str(folder), SOCKET_MOUNT, False))
        return binds

    def _arguments(
        self, binds: list[tuple[str, str, bool]], cwd: str | None, scratch: Scratch | None
    ) -> list[str]:
        from toolgym.sandbox.view import Bind, guards

        arguments = [
            str(bubblewrap()),
            "--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534",
            "--cap-drop", "ALL",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev",
        ]  # fmt: skip
        for path, mount in (("/dev/shm", "shm"), ("/tmp", "tmp")):
            if scratch is not None:
                arguments += ["--bind", str(getattr(scratch, mount)), path]
            else:
                arguments += ["--size", str(self.tmp_bytes), "--tmpfs", path]
            if path == "/dev/shm":
                arguments += ["--remount-ro", "/dev"]
        tops = guards([Bind(source, dest) for source, dest, _ in binds])
        for top in tops:  # a program under /tmp: nothing beside it is writable
            arguments += ["--size", str(1 << 20), "--tmpfs", top]
        for source, dest, system in binds:
            if scratch is not None and not system:
                source = scratch.stage(source)
            arguments += ["--ro-bind", source, dest]
        for top in tops:
            arguments += ["--remount-ro", top]
        workdir = cwd if cwd else "/tmp"
        return [*arguments, "--remount-ro", "/", "--chdir", workdir]


def bubblewrap() -> str | None:
    """bubblewrap's path where it runs here (a user namespace with no network), else None."""
    found = shutil.which("bwrap")
    if found is None:
        return None
    return found if _works(found) else None


_probed: dict[str, bool] = {}


def _works(bwrap: str) -> bool:
    if bwrap not in _probed:
        try:
            done = subprocess.run([bwrap, *_PROBE, "--", "true"], capture_output=True, timeout=10)
            _probed[bwrap] = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _probed[bwrap] = False
    return _probed[bwrap]


def _dropping(scratch: Scratch | None, user: HostUser) -> Callable[[], None]:
    """What the child runs between fork and exec as root: the scratch mounts (the staged
    view, the private /tmp), then the program's host uid for good."""

    def prepare() -> None:
        if scratch is not None:
            scratch.mount()
        become(user)

    return prepare


async def _carry(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
) -> None:
    """One connection from the sandbox, carried to the endpoint and back."""
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
    finally:
        upstream_writer.close()
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()
