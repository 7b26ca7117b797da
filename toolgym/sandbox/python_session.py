"""Code the model writes runs here: a Python session in a process of its own.

An environment that executes model-written text (`PythonREPL`, a grader that runs the model's
function) must not run it in its own process: there the code could reach the environment's
state (its `reward`, the expected answer), the worker's protocol channel, or patch the grader.
`PythonSession` runs the code in a separate interpreter that holds nothing but the code's own
namespace:

    session = PythonSession(timeout=10)
    session.run("x = 41")
    session.run("x + 1").value          # '42'
    session.close()

The session process runs in a working folder of its own (a new temporary folder, removed when
the session stops) and has no descriptor but its own socket (stdin, stdout and stderr are
/dev/null; what the code prints is captured there, cut to `output_limit`, and sent back), an
environment of PATH/HOME/LANG only, and imports nothing from toolgym or the environment
(`python -I python_session.py`). Inside a worker it inherits the worker's limits and walls; the
worker makes itself untraceable (`make_untraceable`), so the code cannot read or write the
worker's memory or descriptors through ptrace or /proc. Sessions start either directly, or,
in a process-backend worker that may not create processes (seccomp), forked from a *zygote*
the worker started before the filter (`start_zygote`); a forked session installs the same
no-new-processes filter before it runs anything.

Whatever the session sends back is untrusted: one JSON reply per request, with the request's
id, strings only, bounded in size. Anything else, a timeout or a death ends the session (its
state is lost, `RunOutput.ended` says why) and the next `run` starts a fresh one.

Standard library only, and runnable as a file, so that it works in minimal worker images.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any

OUTPUT_LIMIT = 4000
"""Characters of stdout, of stderr and of the last expression's repr that a run returns; the
rest is cut and replaced by a note saying how much was dropped."""

IMAGE_LIMIT = 160 * 2**20
"""The most bytes a session's image (`PythonSession.image`) may be (and at most an eighth of
the address space of the process that asks for it, a sandbox worker's memory limit)."""

IMAGE_SECONDS = 20.0
"""How long making or loading an image may take (at least; a session's own timeout if
longer): under a sandbox's call timeout (30 s by default), so that a session that takes too
long is this session's `SessionImageError`, not a worker the host gives up on."""

_IMAGE_ERROR_CHARS = 2000
"""Characters of a session's word on why its image failed that the host reads."""

_ZYGOTE_ANSWER_SECONDS = 5.0
"""How long a worker waits for its zygote to fork a session before declaring it lost."""

_live_folders: set[str] = set()
"""The working folders of this process's running sessions (`live_folders`)."""

_zygote: _Zygote | None = None
"""Set in a worker that may not create processes: sessions are forked from it."""


@dataclass
class RunOutput:
    """What one `PythonSession.run` produced."""

    stdout: str = ""
    stderr: str = ""
    """The traceback of failing code (its own frames only), and what it wrote to stderr."""
    value: str | None = None
    """repr of the value of a final expression, like a REPL shows; None if there was none."""
    ended: str | None = None
    """Why the session ended during this run (timeout, its process died, it broke the
    protocol); its state is lost and the next run starts a fresh one. None if it lives on."""


class PythonSession:
    """A persistent Python namespace in a separate process; each `run` sees what earlier runs
    defined. Starts on the first `run`; `close` stops it.

    Args:
        timeout: Seconds one run may take; past it the session is stopped.
        output_limit: Characters kept per stream (see `OUTPUT_LIMIT`).
    """

    def __init__(self, timeout: float = 10.0, output_limit: int = OUTPUT_LIMIT) -> None:
        self.timeout, self.output_limit = timeout, output_limit
        self._process: _SessionProcess | None = None
        self._next_id = 0

    def run(self, code: str) -> RunOutput:
        """Run `code` in the session and return what it printed and its final value."""
        if self._process is None:
            self._process = self._begin()
        self._next_id += 1
        request = {"id": self._next_id, "code": code, "limit": self.output_limit}
        try:
            reply = self._process.exchange(request, self.timeout, _reply_bytes(self.output_limit))
            return _read_reply(reply, self._next_id, self.output_limit)
        except _SessionEnded as ended:
            self.close()
            return RunOutput(ended=f"{ended}; its state is lost and the next run starts afresh")

    def image(self) -> bytes | None:
        """The session's namespace as bytes (`toolgym.sandbox.session_image`): what
        `load_image` puts into another session. None when no session process runs (nothing
        ran yet, or it ended). Raises `SessionImageError` naming what cannot be copied (a
        generator, an open file, a thread, ...); a session that times out or breaks the
        protocol meanwhile is stopped, and its state is lost."""
        if self._process is None:
            return None
        self._next_id += 1
        limit = _image_limit()
        request = {"id": self._next_id, "image": limit}
        try:
            header, data = self._process.take_image(request, self._image_seconds(), limit)
        except _SessionEnded as ended:
            self.close()
            raise SessionImageError(f"{ended}; its state is lost") from None
        if "error" in header:
            raise SessionImageError(_cut(str(header["error"]), _IMAGE_ERROR_CHARS))
        return data

    def load_image(self, image: bytes) -> None:
        """Start a fresh session process (stopping any that runs) holding `image`'s names.
        Raises `SessionImageError` if they do not load (the session is stopped then)."""
        self.close()
        self._process = self._begin()
        self._next_id += 1
        request = {"id": self._next_id, "load": len(image)}
        try:
            limit = _reply_bytes(_IMAGE_ERROR_CHARS)
            line = self._process.exchange(request, self._image_seconds(), limit, image)
            reply = json.loads(line)
            if not isinstance(reply, dict) or reply.get("id") != self._next_id:
                raise _SessionEnded("the session broke its protocol (an unreadable reply)")
        except (_SessionEnded, ValueError, RecursionError) as error:
            self.close()
            raise SessionImageError(f"the image did not load: {error}") from None
        if reply.get("loaded") is not True:
            self.close()
            why = _cut(str(reply.get("error")), _IMAGE_ERROR_CHARS)
            raise SessionImageError(f"the image did not load: {why}")

    def _image_seconds(self) -> float:
        return max(self.timeout, IMAGE_SECONDS)

    def _begin(self) -> _SessionProcess:
        """A new session process in a working folder of its own (removed when it stops)."""
        folder = tempfile.mkdtemp(prefix="toolgym-session-")
        try:
            process = _start_session(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._next_id += 1
        request = {"id": self._next_id, "folder": folder}
        try:
            reply = json.loads(process.exchange(request, _ZYGOTE_ANSWER_SECONDS, 4096))
            ready = isinstance(reply, dict) and reply == {"id": self._next_id, "ready": True}
        except (_SessionEnded, ValueError, RecursionError):
            ready = False
        if not ready:
            process.kill()
            raise SessionStartError("a new session did not take its working folder")
        _live_folders.add(folder)
        return process

    def close(self) -> None:
        """Stop the session's process (idempotent)."""
        if self._process is not None:
            self._process.kill()
            self._process = None

    def __enter__(self) -> PythonSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SessionStartError(RuntimeError):
    """No session process could be started."""


class SessionImageError(RuntimeError):
    """A session's namespace could not be copied (`PythonSession.image`) or loaded."""


class _SessionEnded(Exception):
    pass


class _SessionProcess:
    """The host's end of one session: its socket and a way to kill it.

    Between calls the session is frozen (SIGSTOP, to its process group where it has one of
    its own): a thread or process the code started in one run does not compute until the next
    run, where it shares that run's time limit. Background work dies with its call."""

    def __init__(
        self, sock: socket.socket, pid: int, popen: subprocess.Popen | None, folder: str
    ) -> None:
        self.sock, self.pid, self.popen, self.folder = sock, pid, popen, folder
        self._buffer = b""
        self._finalizer = weakref.finalize(self, _kill, sock, pid, popen, folder)

    def exchange(
        self, request: dict[str, Any], timeout: float, limit: int, payload: bytes = b""
    ) -> bytes:
        """Send one request (and `payload`'s bytes after it) and read its reply line,
        thawing the session for that time."""
        self._signal(signal.SIGCONT)
        try:
            deadline = time.monotonic() + timeout
            self._send(json.dumps(request).encode() + b"\n", deadline, timeout)
            if payload:
                self._send(payload, deadline, timeout)  # apart: no copy of a large image
            line = self._read_line(deadline, timeout, limit)
            if self._buffer:
                raise _SessionEnded("the session broke its protocol (a reply nobody asked for)")
            return line
        finally:
            self._signal(signal.SIGSTOP)  # frozen until the next call (or killed)

    def take_image(
        self, request: dict[str, Any], timeout: float, limit: int
    ) -> tuple[dict[str, Any], bytes]:
        """Ask for the session's image: its reply header, and the bytes it announced (at
        most `limit`)."""
        self._signal(signal.SIGCONT)
        try:
            deadline = time.monotonic() + timeout
            self._send(json.dumps(request).encode() + b"\n", deadline, timeout)
            line = self._read_line(deadline, timeout, _reply_bytes(_IMAGE_ERROR_CHARS))
            try:
                header = json.loads(line)
                valid = isinstance(header, dict) and header.get("id") == request["id"]
                size = header.get("image") if valid else None
            except (ValueError, RecursionError):
                valid, size = False, None
            if valid and isinstance(header.get("error"), str) and not self._buffer:
                return header, b""
            if not (valid and type(size) is int and 0 <= size <= limit):
                raise _SessionEnded("the session broke its protocol (an unreadable image)")
            data = self._read_bytes(size, deadline, timeout)
            if self._buffer or select.select([self.sock], [], [], 0)[0]:
                if not self._buffer and not self.sock.recv(1, socket.MSG_PEEK):
                    raise _SessionEnded("the session's process ended")  # (out of memory?)
                raise _SessionEnded("the session broke its protocol (a reply nobody asked for)")
            return header, data
        finally:
            self._signal(signal.SIGSTOP)

    def _signal(self, number: int) -> None:
        """Signal the session's process (and, where it leads a group, the group's)."""
        with contextlib.suppress(OSError):  # gone: the next read says so
            if self.popen is not None:
                os.killpg(self.pid, number)  # its own process group: children too
            else:
                os.kill(self.pid, number)  # forked from a zygote, whose group it shares

    def _read_line(self, deadline: float, timeout: float, limit: int) -> bytes:
        """The next line the session sent (what follows it stays in the buffer)."""
        while b"\n" not in self._buffer:
            self._buffer += self._receive(1 << 16, deadline, timeout)
            if len(self._buffer) > limit:
                raise _SessionEnded("the session broke its protocol (an oversized reply)")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _read_bytes(self, size: int, deadline: float, timeout: float) -> bytes:
        """Exactly `size` bytes, the buffer's first (read in place, then one copy into the
        immutable bytes a snapshot shares rather than copies)."""
        data = bytearray(size)
        view = memoryview(data)
        filled = len(self._buffer[:size])
        view[:filled] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        while filled < size:
            room = view[filled : filled + min(1 << 20, size - filled)]
            filled += self._receive_into(room, deadline, timeout)
        view.release()
        return bytes(data)

    def _receive(self, most: int, deadline: float, timeout: float) -> bytes:
        """Some bytes (at most `most`) the session sent."""
        chunk = bytearray(most)
        with memoryview(chunk) as room:
            got = self._receive_into(room, deadline, timeout)
        return bytes(chunk[:got])

    def _receive_into(self, room: memoryview, deadline: float, timeout: float) -> int:
        """Bytes the session sent, into `room`, once it sends any before `deadline`."""
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.sock], [], [], left)[0]:
            raise _SessionEnded(f"the code ran past {timeout:g} s and was stopped")
        try:
            got = self.sock.recv_into(room)
        except OSError:
            got = 0
        if not got:
            raise _SessionEnded("the session's process ended")
        return got

    def _send(self, data: bytes, deadline: float, timeout: float) -> None:
        """All of `data` before `deadline` (a session that stops reading cannot hang us)."""
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self.sock], [], left)[1]:
                raise _SessionEnded(f"the session stopped reading its input for {timeout:g} s")
            try:
                view = view[self.sock.send(view[: 1 << 16]) :]
            except OSError as error:
                raise _SessionEnded(f"the session's process ended ({error.strerror})") from None

    def kill(self) -> None:
        self._finalizer()


def _kill(sock: socket.socket, pid: int, popen: subprocess.Popen | None, folder: str) -> None:
    sock.close()
    with contextlib.suppress(OSError):
        if popen is not None:
            os.killpg(pid, signal.SIGKILL)  # its own process group: children too
        else:
            os.kill(pid, signal.SIGKILL)
    if popen is not None:
        popen.wait()
    shutil.rmtree(folder, ignore_errors=True)
    _live_folders.discard(folder)


def _image_limit() -> int:
    """`IMAGE_LIMIT`, at most an eighth of this process's address space limit (a sandbox
    worker's memory: the image is held here, then copied on its way to a fork), and at most
    `TOOLGYM_IMAGE_BYTES` where a backend sets it (Docker: its memory limit binds the whole
    container, session and worker together)."""
    import resource

    limits = [IMAGE_LIMIT]
    space = resource.getrlimit(resource.RLIMIT_AS)[0]
    if space != resource.RLIM_INFINITY:
        limits.append(space // 8)
    if os.environ.get("TOOLGYM_IMAGE_BYTES", "").isdigit():
        limits.append(int(os.environ["TOOLGYM_IMAGE_BYTES"]))
    return min(limits)


def _reply_bytes(output_limit: int) -> int:
    # three fields of `output_limit` characters, each at most 12 bytes as JSON escapes
    return 36 * output_limit + 4096


def _read_reply(line: bytes, request_id: int, limit: int) -> RunOutput:
    """The session's reply, checked and cut again here: the model's code may have replaced
    the session's own cutting, or written the reply itself."""
    try:
        reply = json.loads(line)
        fields = [reply.get(name) for name in ("stdout", "stderr", "value")]
        valid = (
            reply.get("id") == request_id
            and isinstance(fields[0], str)
            and isinstance(fields[1], str)
            and (fields[2] is None or isinstance(fields[2], str))
        )
    except Exception:  # any decoding failure (RecursionError, ValueError, ...) ends it
        valid = False
    if not valid:
        raise _SessionEnded("the session broke its protocol (an unreadable reply)")
    room = limit + 64  # the session's own cut leaves a note of how much it dropped
    stdout, stderr, value = (None if field is None else _cut(field, room) for field in fields)
    return RunOutput(stdout or "", stderr or "", value)


# -- starting sessions -------------------------------------------------------------------------
def _start_session(folder: str) -> _SessionProcess:
    """A session process (not yet told `folder`, its working folder, which goes with it)."""
    if _zygote is not None:
        return _zygote.fork_session(folder)
    try:
        host, popen = _spawn("--session", start_new_session=True)
    except OSError as error:
        raise SessionStartError(
            f"cannot start a process for the model's code ({error.strerror or error}); a "
            "sandboxed environment that runs model code must declare `runs_model_code = True`"
        ) from None
    return _SessionProcess(host, popen.pid, popen, folder)


def _spawn(role: str, start_new_session: bool = False) -> tuple[socket.socket, subprocess.Popen]:
    """This file run as `role` in a fresh interpreter whose only descriptor is one end of a
    socket pair; the other end, and the process."""
    host, child = socket.socketpair()
    command = [sys.executable, "-I", os.path.abspath(__file__), role, str(child.fileno())]
    try:
        popen = subprocess.Popen(
            [*command, ",".join(_allowed)],  # the filter's lifted rules (`allow`)
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(child.fileno(),),
            env=_session_environment(),
            cwd=tempfile.gettempdir(),
            start_new_session=start_new_session,
        )
    except OSError:
        host.close()
        raise
    finally:
        child.close()
    return host, popen


def _session_environment() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": tempfile.gettempdir(),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


class _Zygote:
    """A clean process, started before the worker's no-new-processes filter, that forks
    sessions on request and hands their sockets back (SCM_RIGHTS)."""

    def __init__(self) -> None:
        self.sock, self.popen = _spawn("--zygote")

    def fork_session(self, folder: str) -> _SessionProcess:
        try:
            self.sock.settimeout(_ZYGOTE_ANSWER_SECONDS)
            self.sock.sendall(b"n")
            message, fds, _, _ = socket.recv_fds(self.sock, 64, 1)
        except OSError as error:  # a timeout too: stopped (SIGSTOP) or stuck
            self.popen.kill()
            raise SessionStartError(f"the session zygote is gone ({error})") from None
        if not fds or not message.isdigit():
            for fd in fds:
                os.close(fd)
            self.popen.kill()
            raise SessionStartError("the session zygote is gone (the model's code killed it?)")
        return _SessionProcess(socket.socket(fileno=fds[0]), int(message), None, folder)

    def lost(self) -> bool:
        """Dead, or stopped (a same-user process can SIGSTOP it): either way, no more
        sessions; a stopped one is killed."""
        if self.popen.poll() is not None:
            return True
        try:
            with open(f"/proc/{self.popen.pid}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in (b"T", b"t"):
            self.popen.kill()
            self.popen.wait()
            return True
        return False


def live_folders() -> set[str]:
    """The working folders of the sessions this process runs (a sandbox worker's snapshot of
    its /tmp leaves them out: each session's image carries its own files)."""
    return set(_live_folders)


def zygote_lost() -> bool:
    """Whether this process had a session zygote and it died (the model's code can kill it:
    same user). A worker then exits after its reply, so the next episode gets a fresh one."""
    return _zygote is not None and _zygote.lost()


def start_zygote() -> None:
    """Start this process's session zygote; call before `install_filter`."""
    global _zygote
    _zygote = _Zygote()


def _serve_zygote(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # sessions are reaped by the kernel
    make_untraceable()
    _libseccomp_path()
    while sock.recv(1) == b"n":
        parent_end, child_end = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (and non-dumpable, inherited)
            keep = child_end.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)
            if install_filter(no_new_processes=True) is not None:
                os._exit(3)  # never run model code without the filter the worker has
            _serve_session(keep)
            os._exit(0)
        child_end.close()
        socket.send_fds(sock, [str(pid).encode()], [parent_end.fileno()])
        parent_end.close()


# -- the session side --------------------------------------------------------------------------
def _serve_session(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    namespace: dict[str, Any] = {"__name__": "__repl__"}
    reader = sock.makefile("rb")
    for line in reader:
        request = json.loads(line)
        if "folder" in request:  # the first request: where the code's files go
            os.chdir(request["folder"])
            _working_folder.append(request["folder"])
            reply = {"id": request["id"], "ready": True}
        elif "image" in request:
            header, data = _image(namespace, request["image"])
            sock.sendall(json.dumps({"id": request["id"], **header}).encode() + b"\n")
            sock.sendall(data)  # apart: no copy of a large image
            del header, data  # not held until the next image
            continue
        elif "load" in request:
            reply = {"id": request["id"], **_load(namespace, reader.read(request["load"]))}
        else:
            reply = {"id": request["id"], **_run(request["code"], namespace, request["limit"])}
        sock.sendall(json.dumps(reply).encode() + b"\n")


_working_folder: list[str] = []
"""The session's working folder (its first request names it): its files go into an image."""


def _image(namespace: dict[str, Any], limit: int) -> tuple[dict[str, Any], bytes]:
    """The namespace's image (`session_image.make_image`), or why there is none."""
    try:
        data = _image_module().make_image(namespace, _working_folder[-1], limit)
    except Exception as error:  # ImageError names what cannot be copied
        return {"error": _cut(str(error), _IMAGE_ERROR_CHARS)}, b""
    if len(data) > limit:
        return {"error": f"the session's state is {len(data):,} bytes, over {limit:,}"}, b""
    return {"image": len(data)}, data


def _load(namespace: dict[str, Any], data: bytes) -> dict[str, Any]:
    try:
        _image_module().load_image(namespace, data, _working_folder[-1])
    except Exception as error:  # a module the image names is missing here, ...
        return {
            "loaded": False,
            "error": _cut(f"{type(error).__name__}: {error}", _IMAGE_ERROR_CHARS),
        }
    return {"loaded": True}


@functools.cache
def _image_module() -> Any:
    """`session_image.py`, beside this file, loaded by path (a session imports nothing from
    toolgym) under the name the images it pickles refer to."""
    import importlib.util

    name = "_toolgym_session_image"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session_image.py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run(code: str, namespace: dict[str, Any], limit: int) -> dict[str, Any]:
    stdout, stderr = io.StringIO(), io.StringIO()
    value = None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            value = _execute(code, namespace)
        except (Exception, SystemExit, KeyboardInterrupt) as error:  # failing code is output
            stderr.write(_traceback(error))
    shown = None
    if value is not None:
        try:
            shown = _cut(repr(value), limit)
        except Exception as error:  # a repr that raises is the code's failure too
            stderr.write(_traceback(error))
    return {
        "stdout": _cut(stdout.getvalue(), limit),
        "stderr": _cut(stderr.getvalue(), limit),
        "value": shown,
    }


def _execute(code: str, namespace: dict[str, Any]) -> Any:
    tree = ast.parse(code, mode="exec")
    last = tree.body[-1] if tree.body else None
    # dont_inherit: the code gets plain Python, not this file's `from __future__` semantics
    # (string annotations would break a dataclass the code defines)
    if isinstance(last, ast.Expr):
        tree.body.pop()
        exec(compile(tree, "<repl>", "exec", dont_inherit=True), namespace)
        expression = ast.Expression(last.value)
        return eval(compile(expression, "<repl>", "eval", dont_inherit=True), namespace)
    exec(compile(tree, "<repl>", "exec", dont_inherit=True), namespace)
    return None


def _cut(text: str, limit: int) -> str:
    """At most `limit` characters of valid Unicode (lone surrogates, e.g. from printing
    undecodable bytes, become `\\udcff` escapes: a tokenizer must take the text). The same
    rule as `toolgym.envs.tools.valid_text`, written here because a session imports nothing
    from toolgym."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... [{len(text) - limit} more characters cut]"


def _traceback(error: BaseException) -> str:
    """The traceback of the model's code only (frames of `<repl>`), like the REPL prints."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == "<repl>"]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames) + traceback.format_exception_only(error)
    return "".join(lines)


# -- process hygiene (also used by the worker) ---------------------------------------------------
def make_untraceable() -> None:
    """Mark this process non-dumpable: processes of the same user without CAP_SYS_PTRACE (the
    model's code) can neither ptrace it nor open its /proc files (memory, descriptors)."""
    import ctypes

    pr_set_dumpable = 4
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0)


HARDENING_RULES: tuple[tuple[str, str], ...] = (
    ("keyctl", "EPERM"),  # the kernel keyring is per host user: a channel across workers
    ("add_key", "EPERM"),
    ("request_key", "EPERM"),
    ("io_uring_setup", "ENOSYS"),  # a large kernel surface; Docker's profile refuses it too
    ("io_uring_enter", "ENOSYS"),
    ("io_uring_register", "ENOSYS"),
    ("memfd_create", "EPERM"),  # memory no file size limit sees
    ("memfd_secret", "EPERM"),
    ("shmget", "EPERM"),  # SysV IPC: memory and queues outside every file limit
    ("msgget", "EPERM"),
    ("semget", "EPERM"),
    ("bpf", "EPERM"),
    ("perf_event_open", "EPERM"),
    ("userfaultfd", "EPERM"),
)
"""System calls the seccomp filter of `install_filter` always refuses, with the errno the
code sees. Besides these, `prlimit64` on any process but the caller fails with EPERM (the
kernel lets a process change the limits of every other process of its user: the worker's and
the zygote's)."""

OPTIONAL_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    # the kernel's AIO contexts come from one quota for the whole host (fs.aio-max-nr): one
    # episode could take it all, and the host's own processes would get EAGAIN
    "aio": (("io_setup", "ENOSYS"), ("io_submit", "ENOSYS")),
    # POSIX message queues: bytes counted per host user, outside every file and memory limit
    "message_queues": (("mq_open", "EPERM"),),
}
"""Refusals an environment class may lift by naming them in its `sandbox_allow` attribute
(e.g. `sandbox_allow = ("message_queues",)`); refused otherwise."""

_allowed: tuple[str, ...] = ()
"""The `OPTIONAL_RULES` this process lifts (`allow`): its sessions lift the same."""


def allow(features: tuple[str, ...] | list[str]) -> None:
    """Lift these `OPTIONAL_RULES` in this process's filter and its sessions' (a worker calls
    it before `start_zygote` and `install_filter`). Raises ValueError for an unknown name."""
    global _allowed
    unknown = sorted(set(features) - set(OPTIONAL_RULES))
    if unknown:
        raise ValueError(
            f"unknown sandbox_allow {unknown}; known: {', '.join(sorted(OPTIONAL_RULES))}"
        )
    _allowed = tuple(sorted(set(features)))


def install_filter(no_new_processes: bool = True) -> str | None:
    """Install this process's seccomp filter (inherited by everything it starts): the
    `HARDENING_RULES`, the `OPTIONAL_RULES` not lifted by `allow`, `prlimit64` on the caller
    only, and with `no_new_processes` fork, vfork and process-creating clone fail with EAGAIN
    (threads still work). Returns None on success, else why it could not.

    The no-new-processes part is how the process backend bounds a fork bomb when it runs as
    root, where RLIMIT_NPROC does not apply.
    """
    import ctypes

    try:
        lib = ctypes.CDLL(_libseccomp_path(), use_errno=True)
    except OSError as error:
        return f"libseccomp not found ({error})"

    class ArgCompare(ctypes.Structure):
        _fields_ = [
            ("arg", ctypes.c_uint),
            ("op", ctypes.c_int),
            ("datum_a", ctypes.c_uint64),
            ("datum_b", ctypes.c_uint64),
        ]

    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_void_p,
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = lib.seccomp_release.argtypes = [ctypes.c_void_p]
    context = lib.seccomp_init(0x7FFF0000)  # SCMP_ACT_ALLOW
    if not context:
        return "seccomp_init failed"
    try:
        for name, code, compare in _filter_rules(no_new_processes):
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # a libseccomp older than the call: nothing to refuse
                continue
            pointer = ctypes.byref(ArgCompare(*compare, 0)) if compare else None
            deny = 0x00050000 | code  # SCMP_ACT_ERRNO(code)
            if lib.seccomp_rule_add_array(context, deny, number, int(bool(compare)), pointer):
                return f"seccomp rule for {name} failed"
        if lib.seccomp_load(context):
            return "seccomp_load failed"
    finally:
        lib.seccomp_release(context)
    return None


def _filter_rules(no_new_processes: bool) -> list[tuple[str, int, tuple[int, int, int] | None]]:
    """(system call, errno, (argument, comparison, value) or None) for each refusal."""
    import errno

    not_equal, masked_eq, clone_thread = 1, 7, 0x00010000
    refused = list(HARDENING_RULES)
    for feature, extra in OPTIONAL_RULES.items():
        if feature not in _allowed:
            refused += extra
    rules: list[tuple[str, int, tuple[int, int, int] | None]] = [
        (name, getattr(errno, code), None) for name, code in refused
    ]
    rules += [("prlimit64", errno.EPERM, (0, not_equal, 0))]  # pid 0: the caller itself
    if no_new_processes:
        rules += [("fork", errno.EAGAIN, None), ("vfork", errno.EAGAIN, None)]
        rules += [("clone", errno.EAGAIN, (0, masked_eq, clone_thread))]
        rules += [("clone3", errno.ENOSYS, None)]  # libc falls back to clone for threads
    return rules


@functools.cache
def _libseccomp_path() -> str:
    """The soname the loader finds, else find_library's answer (it runs ldconfig, a
    process: once, before any filter; forked sessions reuse the answer)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL("libseccomp.so.2")
        return "libseccomp.so.2"
    except OSError:
        return ctypes.util.find_library("seccomp") or "libseccomp.so.2"


def _main(argv: list[str]) -> None:
    role, fd = argv[1], int(argv[2])
    allow([feature for feature in (argv[3] if len(argv) > 3 else "").split(",") if feature])
    if role == "--zygote":
        _serve_zygote(fd)
    elif role == "--session":
        # Best effort outside the process backend (docker bounds processes with its pids
        # limit; `local` is no sandbox): a process the code forks could outlive the session.
        install_filter(no_new_processes=True)
        make_untraceable()  # a leftover of another session cannot read this one
        _serve_session(fd)
    else:
        raise SystemExit(f"usage: python_session.py --zygote FD | --session FD (got {role})")


if __name__ == "__main__":
    _main(sys.argv)
