"""The worker: hosts one environment instance and answers requests over a byte stream.

Standard library only (it runs in a minimal container image); started by
`toolgym/sandbox/boot.py`, which sets and checks its import path first.

Protocol (version 2): JSON lines. The worker first writes a hello line
`{"v": 2, "hello": {"pid": ..., "python": "3.11.2"}}`, then answers each request line with
exactly one reply line carrying the request's `id`:

    request  {"v": 2, "id": 7, "op": OP, ...fields}
    reply    {"v": 2, "id": 7, "ok": true, "value": ..., "state": {"reward": 0.0, "done": false}}
             {"v": 2, "id": 7, "ok": false, "error": {"type": "ValueError", "message": "..."}}

OP is one of:
    create  {"module", "name", "kwargs"}  import module:name and instantiate it
    reset   {"row"}                        the row's columns (and "seed") that the
                                           environment's reset accepts -> the first observation
    call    {"name", "arguments"}          -> {"content": str, "failure": null | "tool_error"
                                              | "tool_exception" | "bad_result"}
    invoke  {"name", "args"}               a protocol method: get_reward, final_answer,
                                           user_turn, inline_step, demonstration,
                                           episode_metrics, close
    snapshot {"limit"}                     -> the episode's state and, where the sandbox's /tmp is
                                           its own, an archive of it, pickled and base64-
                                           encoded (opaque to the host, which never unpickles it)
    restore {"state"}                      a snapshot's state back into this instance (and its
                                           /tmp files into this worker's /tmp)
    ping    {}                             -> "pong" (health check)
    exit    {}                             the worker replies, then exits

A `reset` that fails with the error type `SpoiledWorker` asks the host for a fresh worker.
`state` (after every op that reached the environment) saves the host a round trip for the
reward and `done`. Anything the environment prints goes to stderr: the protocol owns stdout.
A request the worker cannot read gets an error reply with id null; end of input ends it.
"""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import os
import pickle
import platform
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

from toolgym.envs.calls import ToolCall
from toolgym.envs.hooks import INVOKABLE
from toolgym.envs.snapshots import NotForkable
from toolgym.envs.stepping import LocalExecutor
from toolgym.sandbox import tmp_copy
from toolgym.sandbox.python_session import (
    allow,
    install_filter,
    make_untraceable,
    start_zygote,
    zygote_lost,
)

PROTOCOL_VERSION = 2
MAX_CONTENT_CHARS = 1_000_000
"""A tool result longer than this is cut (the protocol stays responsive whatever a tool
returns; environments should truncate to what a model can read long before this)."""
MAX_SNAPSHOT_CHARS = 256 * 2**20
"""The most a snapshot's pickled state may be (base64), whatever the host asks: a host reads
a snapshot's reply up to the limit it asked for (a channel's `snapshot_bytes`)."""


class SpoiledWorker(RuntimeError):
    """`reset` refused: this worker cannot host another episode (the host replaces it)."""


class Worker:
    """The request loop around one environment instance."""

    def __init__(
        self, reader: BinaryIO, writer: BinaryIO, hello: dict[str, Any] | None = None
    ) -> None:
        self.reader, self.writer = reader, writer
        self.hello = {"pid": os.getpid(), "python": platform.python_version(), **(hello or {})}
        self._executor: LocalExecutor | None = None
        self._limits = _own_limits()

    @property
    def executor(self) -> LocalExecutor:
        """The instance's executor (`create` makes it; other ops are refused before that)."""
        if self._executor is None:
            raise RuntimeError("no environment instance yet: send 'create' first")
        return self._executor

    def serve(self) -> None:
        """Say hello, then answer requests until `exit` or the end of input."""
        self._send({"hello": self.hello})
        _silence_output()
        for line in self.reader:
            try:
                request = json.loads(line)
                del line  # a restore's line can be large: not held while it is handled
                if not isinstance(request, dict):
                    raise ValueError("a request is a JSON object")
            except ValueError as error:
                self._send({"id": None, "ok": False, "error": _error(error)})
                continue
            reply = self.handle(request)
            if os.getpid() != self.hello["pid"]:
                os._exit(0)  # a process the environment forked must not answer or read requests
            self._send(reply)
            if request.get("op") == "exit":
                return

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to one request (an error reply if it fails, never an exception)."""
        reply: dict[str, Any] = {"id": request.get("id")}
        op = request.get("op")
        handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        try:
            if request.get("v") != PROTOCOL_VERSION:
                raise ValueError(
                    f"protocol version {request.get('v')!r} (worker speaks {PROTOCOL_VERSION})"
                )
            if handler is None:
                raise ValueError(f"unknown op {op!r}")
            if op not in ("create", "ping", "exit") and self._executor is None:
                raise RuntimeError("no environment yet (send create first)")
            reply.update(ok=True, value=handler(request))
        except Exception as error:
            reply.update(ok=False, error=_error(error))
        if self._executor is not None and op not in ("ping", "exit"):
            reply["state"] = self._state()
        return reply

    # -- operations -------------------------------------------------------------------------
    def _op_create(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["module"] == "__main__":
            raise ValueError(
                f"{request['name']} is defined in the script being run (__main__), which a "
                "worker cannot import: move it to a module"
            )
        try:
            module = importlib.import_module(request["module"])
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"{error}. A sandbox sees only the interpreter, toolgym and the environment's "
                "own module or package: add other folders with ProcessBackend(extra_paths=...) "
                "or DockerBackend(code_paths=...)"
            ) from None
        cls = getattr(module, request["name"])
        instance = cls(**request.get("kwargs", {}))
        self._executor = LocalExecutor(instance)
        # tools the instance binds itself (in __init__): the host, which builds the schemas
        # from the class, must know of them
        bound = (
            [
                name
                for name, value in vars(instance).items()
                if not name.startswith("_") and inspect.ismethod(value)
            ]
            if hasattr(instance, "__dict__")
            else []
        )
        return {"max_turns": self.executor.max_turns, "bound_methods": bound}

    def _op_reset(self, request: dict[str, Any]) -> str | None:
        if zygote_lost():
            raise SpoiledWorker(
                "this worker's session zygote died (the model's code can kill it): it cannot "
                "run code any more; the host starts a fresh worker"
            )
        now = _own_limits()
        changed = [
            f"{name} {was} -> {now[name]}" for name, was in self._limits.items() if was != now[name]
        ]
        if changed:
            raise SpoiledWorker(
                f"this worker's limits were changed from inside ({', '.join(changed)}); the "
                "host starts a fresh worker"
            )
        observation = self.executor.reset(request.get("row", {}))
        return None if observation is None else str(observation)

    def _op_call(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request["name"]
        if name.startswith("_"):
            raise ValueError(f"{name!r} is not a tool")
        arguments = request.get("arguments", {})
        # The same run / error / rendering path as a local call, so the model reads the same
        # text whichever backend hosts the environment (the host already checked the call).
        result = self.executor.run(ToolCall(name, arguments), arguments)
        reply = {"content": result.content[:MAX_CONTENT_CHARS], "failure": result.failure}
        return reply | ({"blocks": result.blocks} if result.blocks else {})

    def _op_invoke(self, request: dict[str, Any]) -> Any:
        """A protocol hook (`toolgym.envs.hooks.INVOKABLE`), by its executor method."""
        name = request["name"]
        if name not in INVOKABLE:
            raise ValueError(f"{name!r} is not a protocol method")
        value = getattr(self.executor, INVOKABLE[name])(*request.get("args", []))
        return _ENCODERS[name](value) if name in _ENCODERS else value

    def _op_snapshot(self, request: dict[str, Any]) -> str:
        """The episode's state (`LocalExecutor.snapshot`), pickled: only a worker unpickles
        it, never the host (the model's code may have shaped it)."""
        limit = min(int(request.get("limit", MAX_SNAPSHOT_CHARS)), MAX_SNAPSHOT_CHARS)
        over = f"over the {limit:,} characters a snapshot may carry here"
        try:
            episode = pickle.dumps(self.executor.snapshot())
            room = limit * 3 // 4 - len(episode)  # base64 makes 4 characters of 3 bytes
            if room < 0:
                raise NotForkable(
                    f"the episode's state is {len(episode) * 4 // 3:,} characters, {over}"
                )
            files = tmp_copy.pack(room) if tmp_copy.private_tmp() else None
            pickled = pickle.dumps({"episode": episode, "files": files})
            del episode, files
            if len(pickled) * 4 // 3 > limit:
                raise NotForkable(f"the episode's state and /tmp are {over}")
            return base64.b64encode(pickled).decode()
        except MemoryError:
            raise NotForkable("the episode's state does not fit this worker's memory") from None

    def _op_restore(self, request: dict[str, Any]) -> None:
        decoded = base64.b64decode(request.pop("state"))  # each copy dropped once used
        saved = pickle.loads(decoded)
        del decoded
        episode = pickle.loads(saved["episode"])
        if saved["files"] is None:
            self.executor.restore(episode)
        else:  # /tmp first (a restored environment may read it), put back if either fails
            tmp_copy.replace(saved.pop("files"), lambda: self.executor.restore(episode))

    def _op_ping(self, request: dict[str, Any]) -> str:
        return "pong"

    def _op_exit(self, request: dict[str, Any]) -> None:
        return None

    # -- helpers -----------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "done": self.executor.done(),
            "max_turns": self.executor.max_turns,  # live: a reset may set it
        }
        if not getattr(self.executor.target, "reward_per_step", False):
            return state  # read once, when the host asks: a lazy reward sees the model's work
        try:
            state["reward"] = self.executor.read_reward()
        except Exception as error:
            state["reward_error"] = f"{type(error).__name__}: {error}"
        return state

    def _send(self, message: dict[str, Any]) -> None:
        message = {"v": PROTOCOL_VERSION, **message}
        self.writer.write(json.dumps(message).encode() + b"\n")
        self.writer.flush()


def _inline_step(step: Any) -> dict[str, Any]:
    if step.observation is not None:
        step.observation = step.observation[:MAX_CONTENT_CHARS]
    return step.to_dict()


def _demonstration(turns: Any) -> Any:
    if turns is None:
        return None
    return [
        turn
        if isinstance(turn, str)  # an inline environment's piece of text
        else [{"name": c.name, "arguments": c.arguments} for c in turn]
        for turn in turns
    ]


_ENCODERS: dict[str, Callable[[Any], Any]] = {
    "inline_step": _inline_step,
    "demonstration": _demonstration,
}
"""How a hook's value crosses the protocol where it is not JSON as it is."""


def _silence_output() -> None:
    """After the hello, what the environment prints goes nowhere: the launcher keeps stderr
    only to explain a death at start, and a flood must not fill a host file or log."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def _error(error: BaseException) -> dict[str, str]:
    return {
        "type": type(error).__name__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error))[-4000:],
    }


def _own_limits() -> dict[str, tuple[int, int]]:
    """This process's resource limits, to notice a change between episodes."""
    import resource

    names = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_NPROC")
    return {name: resource.getrlimit(getattr(resource, name)) for name in names}


def main() -> None:
    """`python -m toolgym.sandbox.worker`: limits, hygiene, then serve stdin/stdout."""
    # The protocol keeps the real stdout; whatever the environment prints goes to stderr
    # until the hello, then nowhere.
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    hello: dict[str, Any] = {}
    memory = os.environ.get("TOOLGYM_MEMORY_BYTES", "")
    if memory.isdigit():  # set by backends whose own limit would kill instead (docker)
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
    make_untraceable()  # model code in a session may not ptrace or open /proc of this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as PID 1 (bubblewrap) nothing else kills it
    # the filter's refusals the environment class lifted (its `sandbox_allow`)
    allow([name for name in os.environ.get("TOOLGYM_SECCOMP_ALLOW", "").split(",") if name])
    no_new_processes = os.environ.get("TOOLGYM_NO_NEW_PROCESSES") == "1"
    if no_new_processes and os.environ.get("TOOLGYM_CODE_SESSIONS") == "1":
        start_zygote()  # sessions for model code fork from it (sandbox/python_session.py)
    problem = install_filter(no_new_processes)  # inherited by every session
    hello["filter"] = problem is None
    hello["no_new_processes"] = no_new_processes and problem is None
    if problem:
        hello["notes"] = [
            f"no seccomp filter (keyring, io_uring, AIO, memfd, SysV and POSIX IPC and "
            f"prlimit on other processes are open; new processes are not "
            f"blocked): {problem}"
        ]
    Worker(sys.stdin.buffer, protocol_out, hello).serve()


if __name__ == "__main__":
    main()
