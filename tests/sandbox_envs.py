"""Environments that misbehave on purpose, for the sandbox tests (imported by the workers)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import toolgym
from toolgym.builtin_envs.python_repl import PythonREPL


class Unprintable:
    """A tool result that is not JSON and whose `str()` fails."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


class Misbehaving(toolgym.Environment):
    """Each tool does one thing a sandbox must survive."""

    def reset(self, fail: bool = False) -> str | None:
        if fail:
            raise RuntimeError("reset failed on purpose")
        self.reward = 0.5
        return "ready"

    def echo(self, text: str) -> str:
        """Answer with the text.

        Args:
            text: Anything.
        """
        return text

    def loop_forever(self) -> str:
        """Never return."""
        while True:
            pass

    def allocate(self, gigabytes: int) -> str:
        """Allocate memory.

        Args:
            gigabytes: How much.
        """
        return str(len(bytearray(gigabytes * 2**30)))

    def fork_bomb(self) -> str:
        """Fork until the sandbox says no."""
        children = []
        try:
            for _ in range(100_000):
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                children.append(pid)
        except OSError as error:
            return f"stopped after {len(children)} processes: {error}"
        finally:
            for pid in children:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        return f"forked {len(children)} processes"

    def exit_now(self) -> str:
        """End the worker process."""
        os._exit(1)

    def write_file(self, path: str) -> str:
        """Write a file.

        Args:
            path: Where.
        """
        Path(path).write_text("written by a sandboxed tool")
        return "written"

    def connect(self, host: str, port: int) -> str:
        """Open a TCP connection.

        Args:
            host: Address.
            port: Port.
        """
        socket.create_connection((host, port), timeout=3).close()
        return "connected"

    def shout(self, megabytes: int) -> str:
        """Print a lot to stdout.

        Args:
            megabytes: How much.
        """
        print("x" * (megabytes << 20))
        return "still here"

    def describe(self, word: str) -> dict:
        """A JSON answer.

        Args:
            word: Any word.
        """
        return {"word": word, "letters": len(word)}

    def unserialisable(self) -> str:
        """Return something that is neither JSON nor text."""
        return Unprintable()  # type: ignore[return-value]


class Prober(toolgym.Environment):
    """Tools a hostile model's code would use to look around and escape (sandbox tests)."""

    def reset(self) -> None:
        self.reward = 0.0

    def environment(self) -> dict:
        """The worker's environment variables."""
        return dict(os.environ)

    def import_path(self) -> list:
        """The worker's sys.path."""
        import sys

        return sys.path

    def status(self) -> dict:
        """Capabilities, no_new_privs and the uid, from /proc/self/status."""
        lines = Path("/proc/self/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        keep = ("Uid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs")
        return {key: fields[key].strip() for key in keep}

    def read(self, path: str) -> str:
        """Read a file.

        Args:
            path: Which.
        """
        return Path(path).read_text()[:200]

    def exists(self, path: str) -> bool:
        """Whether a path exists.

        Args:
            path: Which.
        """
        return os.path.exists(path)

    def fill(self, path: str, megabytes: int) -> str:
        """Write a file of this size.

        Args:
            path: Where (in /tmp or /dev/shm).
            megabytes: How much.
        """
        with open(path, "wb") as file:
            for _ in range(megabytes):
                file.write(b"\0" * (1 << 20))
        return "filled"

    def remount_root_read_write(self) -> str:
        """Try to make / writable again (mount(2) with MS_REMOUNT)."""
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        flags = 32  # MS_REMOUNT
        if libc.mount(b"none", b"/", None, flags, None) != 0:
            return f"refused: errno {ctypes.get_errno()}"
        return "remounted"

    def new_user_namespace(self) -> str:
        """Try unshare(CLONE_NEWUSER | CLONE_NEWNS): capabilities inside a namespace of its own."""
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000 | 0x00020000) != 0:
            return f"refused: errno {ctypes.get_errno()}"
        return "unshared"

    def poison_reward(self) -> str:
        """Set the episode's reward to NaN, as code reaching the environment object could."""
        self.reward = float("nan")
        return "done"

    def stop_reading(self) -> str:
        """Point the worker's stdin at a pipe nobody writes: it never reads a request again."""
        read_end, _write_end = os.pipe()
        os.dup2(read_end, 0)
        return "deaf"


class Forger(toolgym.Environment):
    """A tool that writes forged protocol replies, as code the model wrote could (fd 3 is the
    worker's protocol channel)."""

    def reset(self) -> None:
        self.reward = 0.0

    def forge(self, first_id: int, count: int) -> str:
        """Write replies claiming a win for request ids first_id .. first_id + count - 1.

        Args:
            first_id: The first request id.
            count: How many.
        """
        import json

        for request in range(first_id, first_id + count):
            value = {"content": "forged", "failure": None}
            line = {"v": 1, "id": request, "ok": True, "value": value, "state": {"reward": 1.0}}
            os.write(3, (json.dumps(line) + "\n").encode())
        return "honest"


class Seeded(toolgym.Environment):
    """What a seed draws, and a limit its reset sets (sandbox tests)."""

    def reset(self, turns: int = 2) -> str | None:
        self.max_turns = turns
        return str(self.rng.random())

    def draw(self) -> float:
        """Draw a number."""
        return self.rng.random()


class InlineCalculator(toolgym.Environment):
    """The inline protocol: evaluates `<code>EXPR</code>` pieces and answers `<output>...`;
    a piece that raises is a failed step with reward -0.3; `done` once it evaluated `stop`."""

    inline_markers = ("</code>",)

    def reset(self, seed: int | None = None) -> str:
        self.seen: list[str] = []
        self.answer: str | None = None
        return "Compute with <code>...</code>."

    def inline_step(self, text: str) -> toolgym.InlineStep:
        self.seen.append(text)
        expression = text.rpartition("<code>")[2].removesuffix("</code>").strip()
        if expression == "stop":
            self.done = True
            return toolgym.InlineStep("<output>bye</output>", done=True)
        try:
            value = eval(expression, {"__builtins__": {}})  # a test double of a sandboxed REPL
        except Exception as error:
            return toolgym.InlineStep(f"<output>{type(error).__name__}</output>", -0.3, failed=True)
        return toolgym.InlineStep(f"<output>{value}</output>", 0.1)

    def final_answer(self, text: str) -> None:
        self.answer = text
        self.reward = float("42" in text)


class QueueREPL(PythonREPL):
    """A REPL whose environment asks for POSIX message queues (the filter refuses them
    otherwise); the worker's message-queue bytes are still its own limit."""

    sandbox_allow = ("message_queues",)


class AioREPL(PythonREPL):
    """A REPL whose environment asks for the kernel's AIO (io_setup / io_submit)."""

    sandbox_allow = ("aio",)


def touch_quietly(path: str) -> Touches:
    """Write `path` where this runs (if it can), and give the value back."""
    with contextlib.suppress(OSError):
        Path(path).touch()
    return Touches(path)


class Touches:
    """A value whose unpickling writes a file: where a snapshot is unpickled shows (a copy in
    memory writes nothing)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __deepcopy__(self, memo: dict) -> Touches:
        return Touches(self.path)

    def __reduce__(self):
        return (touch_quietly, (self.path,))


class Keeper(toolgym.Environment):
    """An environment whose state holds what it is told to keep (for snapshot tests)."""

    def reset(self, **row) -> str:
        self.kept: list[object] = []
        return "ready"

    def keep(self, text: str) -> int:
        """Keep some text.

        Args:
            text: Anything.
        """
        self.kept.append(text)
        return len(self.kept)

    def plant(self, path: str) -> str:
        """Keep a value that writes `path` when it is unpickled.

        Args:
            path: A file.
        """
        self.kept.append(Touches(path))
        return "planted"


class Scratchpad(toolgym.Environment):
    """An environment whose tools touch the worker itself, as a model's code could: files in
    its /tmp, a descriptor number kept in its state (for the fork attacks)."""

    def reset(self, **row) -> str:
        self.fd = -1
        return "ready"

    def write(self, file: str, text: str) -> str:
        """Write a file in the worker's /tmp.

        Args:
            file: The file's name.
            text: Its text.
        """
        Path("/tmp", file).write_text(text)
        return "written"

    def read(self, file: str) -> str:
        """Read a file of the worker's /tmp.

        Args:
            file: The file's name.
        """
        try:
            return Path("/tmp", file).read_text()
        except OSError as error:
            return f"unreadable: {type(error).__name__}"

    def hold(self, file: str) -> int:
        """Open a file of the worker's /tmp and keep its descriptor's number in the state.

        Args:
            file: The file's name.
        """
        self.fd = os.open(Path("/tmp", file), os.O_RDONLY)
        return self.fd

    def read_held(self) -> str:
        """Read through the kept descriptor number (pread: a pipe or socket there refuses)."""
        try:
            return os.pread(self.fd, 200, 0).decode(errors="replace")
        except OSError as error:
            return f"unreadable: {type(error).__name__}"
