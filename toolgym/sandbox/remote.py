"""The host side of a sandbox: a channel to a worker, and the executor and `Stepper` of the
environment instance that lives behind it.

`RemoteEnvironment` is a `Stepper` over a `RemoteExecutor`: the stepping surface every
environment has (`reset`, the class's tools and schemas, `reward`, `done`, `step`/`astep`,
`close`), so agents and trainers use it unchanged; the instance's own attributes stay in the
worker.
The host checks every tool call against the schemas (as for a local environment) and the
worker only runs calls that passed. Every request has a timeout. A timeout or a dead worker
raises `SandboxTimeout` / `SandboxError`, the worker is killed, and the next `reset` starts a
fresh one. The Stepper ends the episode with `tool_timeout` / `tool_crash` (the model's
outcome, in the loss) when the worker failed during what the model sent, else `env_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolgym.envs.calls import (
    Demonstration,
    EpisodeFailure,
    InfrastructureFailure,
    ModelFailure,
    ToolCall,
    ToolResult,
    as_episode_metrics,
)
from toolgym.envs.hooks import HOOK_NAMES, RESERVED_NAMES, TRL_NOT_TOOLS
from toolgym.envs.inline import InlineStep, as_inline_step
from toolgym.envs.snapshots import NotForkable
from toolgym.envs.stepping import Executor, Stepper
from toolgym.envs.tools import checked_blocks, tool_table
from toolgym.sandbox.worker import MAX_SNAPSHOT_CHARS, PROTOCOL_VERSION

_log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 16 * 2**20
"""A reply line longer than this means a broken worker (the worker cuts tool results well
below it); the channel is closed."""


class SandboxError(EpisodeFailure, RuntimeError):
    """The sandbox failed: the worker could not start, died, or broke the protocol. As it is,
    the environment's failure (`env_error`); when it happened during the model's own call, the
    executor raises it again as one of the model-caused subclasses below (`model_caused`)."""


class SandboxTimeout(SandboxError, TimeoutError):
    """A request ran past its timeout; the worker was killed."""


class RemoteError(SandboxError):
    """The environment raised inside the worker (e.g. in `reset`); carries its traceback."""

    def __init__(self, op: str, error: dict[str, Any]) -> None:
        super().__init__(f"{op} raised {error.get('type')}: {error.get('message')}")
        self.op, self.reply = op, error
        self.type = error.get("type")
        self.remote_traceback = error.get("traceback", "")


class WorkerLostToModel(SandboxError, ModelFailure):
    """The worker died or broke the protocol while it ran a call the model made (its code
    exhausted memory, killed or crippled the worker): the model's outcome, `tool_crash`."""


class WorkerTimedOutOnModel(SandboxTimeout, ModelFailure):
    """The worker ran past its time limit on a call the model made (its code slept or spun):
    the model's outcome, `tool_timeout`."""


class ModelRemoteError(RemoteError, ModelFailure):
    """The environment's code in the worker raised on the model's text (`ModelCausedError`
    there): the model's outcome, `tool_crash`."""


def model_caused(error: SandboxError) -> SandboxError:
    """`error`, raised during a call the model made to a worker that was alive when it began,
    as the model-caused failure it is (raise it `from error`)."""
    if isinstance(error, ModelFailure):
        return error
    marked: SandboxError
    if isinstance(error, RemoteError):
        marked = ModelRemoteError(error.op, error.reply)
    elif isinstance(error, SandboxTimeout):
        marked = WorkerTimedOutOnModel(str(error))
    else:
        marked = WorkerLostToModel(str(error))
    return marked


@dataclass
class Isolation:
    """What a sandbox actually got, so nobody has to guess (`RemoteEnvironment.isolation`)."""

    backend: str
    network: bool = True
    """Whether the worker can reach any network (host loopback included)."""
    filesystem: str = "host"
    """"host" (read-write as the user), "read-only" (host visible read-only, private /tmp),
    or "image" (a container's read-only root)."""
    limits: dict[str, Any] = field(default_factory=dict)
    """Enforced resource limits (memory bytes, cpu seconds, processes, open files)."""
    user: str = ""
    notes: list[str] = field(default_factory=list)
    """What was asked for and not available."""


class Channel(ABC):
    """A byte stream to one worker: JSON lines out, JSON lines back."""

    isolation: Isolation

    snapshot_bytes: int = MAX_SNAPSHOT_CHARS
    """The most characters a snapshot's state may carry through this channel (the worker
    says `NotForkable` past it)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._next_id = 0
        self._lock = threading.Lock()

    @abstractmethod
    def _write(self, data: bytes, timeout: float) -> None:
        """Send bytes to the worker; raises TimeoutError when it does not take them in time."""

    @abstractmethod
    def _read(self, timeout: float) -> bytes:
        """Some protocol bytes, b"" at end of stream; raises TimeoutError."""

    @abstractmethod
    def kill(self) -> None:
        """Stop the worker now (idempotent)."""

    @property
    @abstractmethod
    def alive(self) -> bool:
        """Whether the worker process or container is running."""

    def hello(self, timeout: float) -> dict[str, Any]:
        """Wait for the worker's hello line."""
        with self._lock:
            message = self._read_message(time.monotonic() + timeout, "start")
        if "hello" not in message:
            self.kill()
            raise SandboxError(f"worker did not say hello: {message!r}")
        return message["hello"]

    def request(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply; raises SandboxTimeout / SandboxError.

        Exactly one reply per request: bytes that arrive before a request is sent, a reply to
        another id, or more bytes after the reply mean that something else is writing to the
        channel (code the model wrote, forging replies), and the worker is killed.
        """
        with self._lock:
            self._refuse_unasked(op)
            self._next_id += 1
            message = {"v": PROTOCOL_VERSION, "id": self._next_id, "op": op, **fields}
            try:
                self._write(json.dumps(message).encode() + b"\n", timeout)
            except TimeoutError:  # before OSError: a socket timeout is both
                self.kill()
                raise SandboxTimeout(
                    f"{op}: the worker stopped reading requests; worker killed"
                ) from None
            except (OSError, ValueError) as error:
                self.kill()
                raise SandboxError(f"worker is gone ({op}): {error}") from error
            reply = self._read_message(time.monotonic() + timeout, op)
            if reply.get("id") != self._next_id:
                self.kill()
                raise SandboxError(
                    f"worker broke the protocol during {op}: a reply to request "
                    f"{reply.get('id')!r} when {self._next_id} was asked; worker killed"
                )
            self._refuse_unasked(op)
            return reply

    def _refuse_unasked(self, op: str) -> None:
        """Kill the worker if the channel holds bytes nobody asked for."""
        extra = self._buffer
        if not extra and self.alive:
            try:
                extra = self._read(0.0)
            except (TimeoutError, OSError):
                extra = b""
        if extra:
            self._buffer = b""
            self.kill()
            raise SandboxError(
                f"worker broke the protocol around {op}: {len(extra)} bytes nobody asked for "
                f"({extra[:80]!r}); worker killed"
            )

    def close(self, timeout: float = 2.0) -> None:
        """Ask the worker to exit, then make sure it has."""
        if self.alive:
            with contextlib.suppress(SandboxError):
                self.request("exit", timeout)
        self.kill()

    def _read_message(self, deadline: float, op: str) -> dict[str, Any]:
        limit = self.snapshot_bytes + MAX_REPLY_BYTES if op == "snapshot" else MAX_REPLY_BYTES
        buffer, searched = bytearray(self._buffer), 0  # a snapshot's line may be large
        while (end := buffer.find(b"\n", searched)) < 0:
            searched = len(buffer)
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                chunk = self._read(remaining)
            except TimeoutError:
                self.kill()
                raise SandboxTimeout(f"{op} took over its time limit; worker killed") from None
            except OSError as error:
                self.kill()
                raise SandboxError(f"worker stream failed during {op}: {error}") from error
            if not chunk:
                why = self.exit_description()
                self.kill()
                raise SandboxError(f"worker died during {op} ({why})")
            buffer += chunk
            if len(buffer) > limit:
                self._buffer = b""
                self.kill()
                raise SandboxError(f"worker reply to {op} exceeds {limit:,} bytes")
        line, self._buffer = bytes(buffer[:end]), bytes(buffer[end + 1 :])
        try:  # NaN and Infinity are no JSON: a worker sending them is broken or forged
            return json.loads(line, parse_constant=_not_json)
        except (ValueError, RecursionError) as error:
            self.kill()
            raise SandboxError(f"worker broke the protocol during {op}: {line[:200]!r}") from error

    def exit_description(self) -> str:
        """How the worker ended (exit code, signal, out of memory), for error messages."""
        return "stream closed"


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class Backend(Protocol):
    """Starts workers: `start(target)` returns a channel whose worker has said hello (the
    environment class is passed so a backend can make its module importable there)."""

    name: str

    def start(self, target: type | None = None) -> Channel:
        """A new worker for `target`, after its hello."""
        ...


class RemoteExecutor(Executor):
    """The executor of an instance that lives in a worker: every request has a timeout, and
    the reward and `done` come back with each reply. A timeout or a dead worker raises
    `SandboxTimeout` / `SandboxError`, as a model-caused subclass (`model_caused`) when it
    happened during what the model sent (the Stepper turns that into `tool_timeout` /
    `tool_crash`, the model's outcome; otherwise `env_error`); the next `reset` starts a fresh
    worker."""

    def __init__(
        self,
        target: type,
        kwargs: dict[str, Any],
        backend: Backend,
        call_timeout: float,
        start_timeout: float,
        channel: Channel | None = None,
    ) -> None:
        if "<locals>" in target.__qualname__:
            raise SandboxError(
                f"{target.__qualname__} is defined inside a function; a sandbox's worker imports "
                f"the class by module and name ({target.__module__}), so move it to the "
                "module's top level"
            )
        self.target, self.kwargs, self.backend = target, kwargs, backend
        self.call_timeout, self.start_timeout = call_timeout, start_timeout
        self.max_turns = getattr(target, "max_turns", None)
        self.last_isolation: Isolation | None = None
        """What the last worker got, kept when the instance is closed."""
        self.revoked: str | None = None
        """Why this instance may not be used any more (set by its pool), or None."""
        self.channel: Channel | None = None
        self.restarts = -1
        self._episodes = 0  # started on the current worker
        self._reward: float | None = 0.0
        self._done, self._reward_error = False, None
        self._connect(channel)

    def reset(self, row: dict[str, Any]) -> str | None:
        """Start an episode. A class that runs the model's code gets a fresh worker for every
        episode after the first (a fresh /tmp, /dev/shm, IPC namespace and session: nothing
        the code left behind reaches the next episode); others keep their worker, which the
        model cannot write to. A worker that reports itself spoiled is replaced too."""
        if self._episodes and getattr(self.target, "runs_model_code", False):
            self._connect(None)
        self.channel_or_start()
        try:
            observation = self.request("reset", row=row)
        except RemoteError as error:
            if error.type != "SpoiledWorker":
                raise
            _log.warning("%s: a fresh worker replaces one that %s", self.target.__qualname__, error)
            self._connect(None)  # e.g. the model's code killed its session zygote
            observation = self.request("reset", row=row)
        self._episodes += 1
        return observation

    def snapshot(self) -> dict[str, Any]:
        """The episode's state as the worker pickles it, kept opaque: the host never unpickles
        what a worker (and the model's code in it) wrote; only a worker does, in `restore`."""
        try:
            pickled = self.request("snapshot", self._copy_timeout(), limit=self._snapshot_limit())
            return {"pickled": pickled, "target": self.target.__qualname__}
        except RemoteError as error:
            if error.type == "NotForkable":
                raise NotForkable(f"{self.target.__qualname__} in a sandbox: {error}") from None
            raise

    def restore(self, state: dict[str, Any]) -> None:
        """A snapshot's state back into this instance's worker (started if there is none)."""
        self.channel_or_start()
        if len(state["pickled"]) > self._snapshot_limit():  # e.g. a process sandbox's into Ray
            raise NotForkable(
                f"{self.target.__qualname__}: the snapshot is {len(state['pickled']):,} "
                f"characters, over the {self._snapshot_limit():,} this sandbox can take"
            )
        try:
            self.request("restore", self._copy_timeout(), state=state["pickled"])
        except RemoteError as error:
            if error.type == "NotForkable":
                raise NotForkable(f"{self.target.__qualname__} in a sandbox: {error}") from None
            raise
        self._episodes = max(self._episodes, 1)

    def _snapshot_limit(self) -> int:
        """What the channel carries, and at most a fifth of the worker's memory: a snapshot is
        held a few times over on its way (pickle, base64, JSON), and a restore that does not
        fit would kill the new worker instead of saying `NotForkable` here."""
        if self.channel is None:
            return 0
        memory = self.channel.isolation.limits.get("memory_bytes")
        fits = memory // 5 if isinstance(memory, int) and memory > 0 else MAX_SNAPSHOT_CHARS
        return min(self.channel.snapshot_bytes, fits)

    def _copy_timeout(self) -> float:
        """A snapshot or restore moves up to `snapshot_bytes` (and a code session's image,
        bounded by its own time limit): more time than a call."""
        return self.call_timeout + 60.0

    def fork(self, n: int = 1) -> list[Executor]:
        """`n` new sandboxes (fresh workers: each its own identity, limits and /tmp) of the
        same class, with this episode's state (snapshotted once) restored in each, and a copy
        of the files in this worker's /tmp where it is the sandbox's own (its backend says so
        with `TOOLGYM_PRIVATE_TMP`; never the host's /tmp)."""
        state = self.snapshot()
        copies: list[Executor] = []
        try:
            for _ in range(n):
                copy = RemoteExecutor(
                    self.target, self.kwargs, self.backend, self.call_timeout, self.start_timeout
                )
                copies.append(copy)
                copy.restore(state)
        except BaseException:
            for made in copies:
                made.close()
            raise
        return copies

    def run(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        value = self._model_request("call", name=call.name, arguments=arguments)
        try:  # the worker's process may be the model's by now
            blocks = checked_blocks(value["blocks"]) if value.get("blocks") else None
        except ValueError as error:
            if self.channel is not None:
                self.channel.kill()
            raise WorkerLostToModel(f"{error}; worker killed") from None
        return ToolResult(call, value["content"], value["failure"], blocks=blocks)

    def _model_request(self, op: str, **fields: Any) -> Any:
        """A request that carries what the model wrote (a call, an inline step, a final
        answer): a worker that was alive before it and dies or times out during it raises
        the model-caused failure (`model_caused`)."""
        lived = self.channel is not None and self.channel.alive and not self.revoked
        try:
            return self.request(op, **fields)
        except RemoteError as error:
            # the environment's code raised: the model's doing where the worker's executor
            # said so (`ModelCausedError`: it raised on the model's text), else its own
            if error.type == "ModelCausedError":
                raise model_caused(error) from error
            raise
        except SandboxError as error:
            # it lived up to the call, and no pool revoked the lease meanwhile
            if lived and not isinstance(error, InfrastructureFailure) and not self.revoked:
                raise model_caused(error) from error
            raise

    async def arun(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        try:
            return await asyncio.to_thread(self.run, call, arguments)
        except asyncio.CancelledError:  # the agent's own timeout fired first
            if self.channel is not None:
                self.channel.kill()
            raise

    def reward(self) -> float:
        value = self.read_reward()
        if value is None:
            raise SandboxError(f"{self.target.__name__} reports no reward (None)")
        return value

    def read_reward(self) -> float | None:
        """The reward, None where the environment reports none. A class with per-step
        rewards reports it with every reply; others are asked once, when the episode's reward
        is read (a lazy reward then sees the model's work). A worker that is gone leaves the
        last reward it reported (None if none)."""
        if self._reward_error:
            raise SandboxError(f"get_reward failed in the worker: {self._reward_error}")
        alive = self.channel is not None and self.channel.alive and not self.revoked
        if getattr(self.target, "reward_per_step", False) or not alive:
            return self._reward
        value = self.request("invoke", name="get_reward")
        self._reward = None if value is None else float(value)
        return self._reward

    def done(self) -> bool:
        return self._done

    def final_answer(self, text: str) -> None:
        self._model_request("invoke", name="final_answer", args=[text])

    def user_turn(self, answer: str) -> str | None:
        message = self._model_request("invoke", name="user_turn", args=[answer])
        return None if message is None else str(message)

    def inline(self, text: str) -> InlineStep:
        return as_inline_step(self._model_request("invoke", name="inline_step", args=[text]))

    def demonstration(self) -> Demonstration | None:
        turns = self.request("invoke", name="demonstration")
        if turns is None:
            return None
        if all(isinstance(turn, str) for turn in turns):  # an inline environment's pieces
            return [str(turn) for turn in turns]
        return [[ToolCall(c["name"], c["arguments"]) for c in turn] for turn in turns]

    def metrics(self) -> dict[str, float]:
        return as_episode_metrics(self.request("invoke", name="episode_metrics"))

    def close(self) -> None:
        """Stop the worker (the environment's own `close` runs there first)."""
        if self.channel is not None:
            self.last_isolation = self.channel.isolation
            if self.channel.alive:
                with contextlib.suppress(SandboxError):
                    self.request("invoke", name="close")
            self.channel.close()
            self.channel = None

    def channel_or_start(self) -> Channel:
        """The worker's channel, starting a fresh worker if there is none or it died."""
        if self.revoked:
            raise SandboxError(self.revoked)
        if self.channel is None or not self.channel.alive:
            self._connect(None)
        assert self.channel is not None
        return self.channel

    def request(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        """One request to the worker; its reply's value (RemoteError if the op raised)."""
        if self.revoked:
            raise SandboxError(self.revoked)
        channel = self.channel
        if channel is None or not channel.alive:  # only reset() starts a new worker
            raise SandboxError(f"{op}: the worker is gone (reset() starts a new one)")
        reply = channel.request(op, timeout or self.call_timeout, **fields)
        state = reply.get("state")
        if state:
            self._done = bool(state.get("done"))
            self.max_turns = state.get("max_turns", self.max_turns)
            if "reward" in state or "reward_error" in state:  # classes with per-step rewards
                reward = state.get("reward", self._reward)
                self._reward = None if reward is None else float(reward)
                self._reward_error = state.get("reward_error")
        if not reply.get("ok"):
            raise RemoteError(op, reply.get("error") or {})
        return reply.get("value")

    def _connect(self, channel: Channel | None) -> None:
        if self.channel is not None:
            self.channel.kill()
        self.channel = channel or self.backend.start(self.target)
        self.restarts += 1
        self._episodes = 0
        self._reward, self._done, self._reward_error = 0.0, False, None
        module, name = self.target.__module__, self.target.__qualname__
        created = self.request(
            "create", self.start_timeout, module=module, name=name, kwargs=self.kwargs
        )
        self.max_turns = created.get("max_turns", self.max_turns)
        not_tools = {*tool_table(self.target), *RESERVED_NAMES, *TRL_NOT_TOOLS, *HOOK_NAMES}
        bound = sorted(set(created.get("bound_methods") or ()) - not_tools)
        if bound:
            self.channel.kill()
            raise SandboxError(
                f"{self.target.__qualname__} binds tools in __init__ ({', '.join(bound)}), "
                "which a sandbox cannot serve (the host builds tool schemas from the class): "
                "define them as methods of the class, or run it without a sandbox"
            )


class RemoteEnvironment(Stepper):
    """An environment instance that lives in a worker (a subprocess or a container), stepped
    like a local one: the host checks every call against the class's tool table, the worker
    runs calls that passed.

    Args:
        target: The environment class (importable by module and name in the worker).
        kwargs: Its constructor arguments (JSON-serialisable).
        backend: Starts workers (`ProcessBackend`, `DockerBackend`).
        call_timeout: Seconds one request (reset, one tool call, ...) may take.
        start_timeout: Seconds a new worker may take to start and build the environment.
        channel: A started channel to use first.
        pool: The `SandboxPool` this instance belongs to; `close()` gives it back there.
    """

    executor: RemoteExecutor

    def __init__(
        self,
        target: type,
        kwargs: dict[str, Any] | None = None,
        *,
        backend: Backend,
        call_timeout: float = 30.0,
        start_timeout: float = 60.0,
        channel: Channel | None = None,
        pool: Any = None,
    ) -> None:
        tool_table(target)  # a class that cannot be stepped fails here, before a worker starts
        executor = RemoteExecutor(
            target, dict(kwargs or {}), backend, call_timeout, start_timeout, channel
        )
        super().__init__(executor)
        self.backend, self.pool = backend, pool

    @property
    def target(self) -> type:
        """The environment class."""
        return self.executor.target

    @property
    def kwargs(self) -> dict[str, Any]:
        """The class's constructor arguments."""
        return self.executor.kwargs

    @property
    def call_timeout(self) -> float:
        """Seconds one request may take."""
        return self.executor.call_timeout

    def _around(self, executor: Executor) -> RemoteEnvironment:
        """A fork: a `RemoteEnvironment` of its own over the new worker (in no pool)."""
        copy = RemoteEnvironment.__new__(RemoteEnvironment)
        Stepper.__init__(copy, executor)
        copy.backend, copy.pool = self.backend, None
        return copy

    def close(self) -> None:
        """Give the instance back to its pool, or stop its worker."""
        if self.pool is not None:
            self.pool.release(self)
        else:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop the worker (the environment's own `close` runs there first)."""
        self.executor.close()

    @property
    def isolation(self) -> Isolation:
        """What the current worker got (network, filesystem, limits, user); of a closed
        instance, what its last worker had (asking starts no worker)."""
        executor = self.executor
        if executor.channel is None and executor.last_isolation is not None:
            return executor.last_isolation
        return executor.channel_or_start().isolation

    @property
    def alive(self) -> bool:
        """Whether the instance's worker is running."""
        channel = self.executor.channel
        return channel is not None and channel.alive

    @property
    def restarts(self) -> int:
        """Workers started after the first (each reset after a death starts one)."""
        return self.executor.restarts

    @property
    def revoked(self) -> str | None:
        """Why this instance may not be used any more (set by its pool), or None."""
        return self.executor.revoked

    @revoked.setter
    def revoked(self, why: str | None) -> None:
        self.executor.revoked = why

    def __repr__(self) -> str:
        return f"RemoteEnvironment({self.target.__name__}, backend={self.backend.name})"


def ping(env: RemoteEnvironment, timeout: float = 5.0) -> bool:
    """Health check: True when the environment's worker is running and answers in time."""
    channel = env.executor.channel
    if channel is None or not channel.alive:
        return False
    try:
        return channel.request("ping", timeout).get("value") == "pong"
    except SandboxError:
        return False
