"""The `ray` backend: each instance in a Ray actor that Ray places on a node of a cluster, and
inside it the chosen inner sandbox on that node.

    env = toolgym.make("PythonREPL-v0", sandbox=RayBackend(resources={"envhost": 1}))
    env.isolation     # backend "ray", the node, and the inner sandbox it really got

The actor (`_Relay`) starts the inner worker with the inner backend (`ProcessBackend` by
default) and relays bytes; it decides nothing. The host keeps the executor protocol as for the
other backends: it checks tool calls against the class's schemas, parses every reply line,
checks that exactly one reply answers each request (`Channel.request`), and puts every request
under a timeout (`ray.get(..., timeout=...)`, a little above the request's own timeout, which
the actor enforces on the inner worker). A dead actor or node, or a Ray call past its time,
is a `SandboxError` / `SandboxTimeout` from the channel, never a hang.

One actor call per request: `exchange` sends the request line and returns the reply's bytes
together with whatever else the worker wrote right after it; bytes found waiting before a
request is sent end the worker before the request is written (the same refusal as
`Channel._refuse_unasked`, decided on the host).

Pools: `SandboxPool(cls, backend=RayBackend(spread=True), size=N)` keeps N actors warm across
the cluster's nodes (Ray's SPREAD strategy), with the lease rules of every pool; an instance
whose node died fails its health check or its episode (`env_error`) and is replaced on a live
node. `GRPOConfig(sandbox="ray")` (`toolgym train --sandbox ray`) builds such a pool.

Address: `RayBackend(address=...)`, else `RAY_ADDRESS`, else a Ray started for this process
(`ray.init()`: without the dashboard unless `init_options` asks, and with a watchdog that
ends its processes when this process is killed). Ray is an optional extra: `pip install
toolgym[ray]`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from toolgym.envs.calls import InfrastructureFailure
from toolgym.sandbox import ray_watchdog
from toolgym.sandbox.remote import (
    MAX_REPLY_BYTES,
    Backend,
    Channel,
    Isolation,
    SandboxError,
)

NAMESPACE = "toolgym"
"""The Ray namespace of the sandbox actors (named `toolgym-sandbox-<hex>`)."""
ACTOR_PREFIX = "toolgym-sandbox-"
RAY_MARGIN = 5.0
"""Seconds a Ray call may take beyond the request's own timeout (which the actor enforces on
the inner worker) before the host gives up on the actor."""
_KINDS = ("num_cpus", "num_gpus", "memory")
_INIT_LOCK = threading.Lock()


def _ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise SandboxError(
            "the ray backend needs Ray: pip install 'toolgym[ray]' (or 'ray[default]')"
        ) from error
    return ray


class ActorLost(SandboxError, InfrastructureFailure):
    """The sandbox's Ray actor is gone: killed, or its node died: the infrastructure's doing,
    never the model's (the episode is left out of baselines and the loss)."""


@dataclass
class RayIsolation(Isolation):
    """What a Ray-hosted sandbox got: the inner sandbox's fields (network, filesystem, limits,
    user, notes) as its backend reported them, and where it runs."""

    inner: str = ""
    """The inner backend's name ("process", "docker")."""
    node_id: str = ""
    """The Ray node that hosts the actor (hex id)."""
    node_ip: str = ""
    actor: str = ""
    """The actor's name in the `toolgym` namespace."""


@dataclass
class RayBackend:
    """Starts each worker inside a Ray actor, placed by Ray on a node with `resources`.

    Args:
        address: The cluster to join (`ray.init(address=...)`); default `RAY_ADDRESS`, else a
            Ray started for this process. Ignored when Ray is initialised already.
        resources: What each actor asks of its node: `num_cpus` (default 1), `num_gpus`,
            `memory` (bytes) and custom resources (`{"envhost": 1}`).
        inner: The sandbox inside the actor: "process" (`ProcessBackend()`, the default),
            "docker" (the node's Docker daemon), "local" (a worker subprocess with the
            process backend's limits but without bubblewrap), "inline" (the instance in the
            actor's own process: no isolation and no kill, for trusted or simulated
            environments only; a tool past its timeout keeps its thread) or a backend object
            (pickled to the node).
        start_timeout: Seconds for Ray to place the actor and for the inner worker to start.
        runtime_env: Ray's runtime environment for the actors (e.g. `py_modules` for an
            environment class that the nodes cannot import otherwise).
        init_options: Further arguments for `ray.init` when this backend starts Ray (a Ray
            started here has no dashboard unless they say `include_dashboard=True`).
        spread: Place the actors with Ray's SPREAD strategy: each new actor on the feasible
            node that hosts the fewest, so that a pool's instances are spread over the
            cluster's nodes. Ray's default strategy fills the node of the caller first (up to
            half its resources) and packs, which keeps a small pool on one node; it matters
            for pools, not for a single instance or for actors pinned by a custom resource
            that one node has.
        per_actor: Instances one actor hosts (1: an actor per instance). Above 1, an actor
            (asking `resources` once) hosts up to this many, each in its own inner sandbox
            (its own object with "inline"): fewer Ray workers for thousands of light
            instances. Killing an instance stops its inner worker, not the actor; the actor
            goes with its last instance; a lost actor fails all of its instances.
    """

    address: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    inner: str | Backend = "process"
    start_timeout: float = 120.0
    runtime_env: dict[str, Any] | None = None
    init_options: dict[str, Any] = field(default_factory=dict)
    spread: bool = False
    per_actor: int = 1
    name: str = "ray"
    _hosts: list[_Host] = field(default_factory=list, init=False, repr=False, compare=False)
    _hosts_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.per_actor, int) or self.per_actor < 1:
            raise ValueError(f"RayBackend per_actor must be a positive int, not {self.per_actor!r}")
        for key, value in self.resources.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"RayBackend resources: {key}={value!r} is not a non-negative number"
                )

    def start(self, target: type | None = None) -> RayChannel:
        """A worker for `target` in a new actor (or, with `per_actor` above 1, in an actor
        that has room), after the worker's hello."""
        ray = self.connect()
        module = target.__module__ if target is not None else None
        qualname = target.__qualname__ if target is not None else None
        if self.per_actor > 1:
            return self._start_shared(ray, module, qualname)
        actor, actor_name = self._new_actor(ray, max_concurrency=2)
        try:
            started = ray.get(
                actor.start.remote(self.inner, module, qualname), timeout=self.start_timeout
            )
        except BaseException as error:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise _start_error(ray, error, self.resources, self.start_timeout) from error
        return RayChannel(actor, actor_name, started)

    def _new_actor(self, ray: Any, max_concurrency: int) -> tuple[Any, str]:
        actor_name = ACTOR_PREFIX + uuid.uuid4().hex[:12]
        options: dict[str, Any] = {k: v for k, v in self.resources.items() if k in _KINDS}
        options.setdefault("num_cpus", 1)
        custom = {k: v for k, v in self.resources.items() if k not in _KINDS}
        if custom:
            options["resources"] = custom
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        if self.spread:
            options["scheduling_strategy"] = "SPREAD"
        actor = (
            _relay_class(ray)
            .options(
                name=actor_name,
                namespace=NAMESPACE,
                # `kill` is served while an exchange waits on the worker
                max_concurrency=max_concurrency,
                max_restarts=0,
                **options,
            )
            .remote()
        )
        return actor, actor_name

    def _start_shared(self, ray: Any, module: str | None, qualname: str | None) -> RayChannel:
        """A worker in an actor with room (a new actor when none has), in a slot of its own."""
        with self._hosts_lock:
            host = next((h for h in self._hosts if h.live < self.per_actor), None)
            if host is None:
                actor, actor_name = self._new_actor(ray, 2 * self.per_actor + 2)
                host = _Host(actor, actor_name)
                self._hosts.append(host)
            host.live += 1
            host.slots += 1
            slot = host.slots
        try:
            started = ray.get(
                host.actor.start.remote(self.inner, module, qualname, slot),
                timeout=self.start_timeout,
            )
        except BaseException as error:
            with contextlib.suppress(Exception):  # a slow start: its worker goes too
                ray.get(host.actor.kill.remote(slot=slot), timeout=2.0)
            lost = isinstance(error, ray.exceptions.RayActorError)
            # an actor that is gone, or that could not start a worker in time, takes no more
            self._release(host, lost=lost, retire=True)
            raise _start_error(ray, error, self.resources, self.start_timeout) from error
        release = functools.partial(self._release, host)
        return RayChannel(host.actor, host.name, started, slot=slot, on_kill=release)

    def _release(self, host: _Host, lost: bool = False, retire: bool = False) -> None:
        """One instance of `host` is gone. The actor goes with its last instance, or at once
        when Ray reported it `lost`; a lost or `retire`d actor takes no new instance."""
        with self._hosts_lock:
            host.live -= 1
            if (lost or retire or host.live <= 0) and host in self._hosts:
                self._hosts.remove(host)
            end = lost or host.live <= 0
        if end:
            with contextlib.suppress(Exception):
                _ray().kill(host.actor, no_restart=True)

    def connect(self) -> Any:
        """Ray, initialised (joining `address`, `RAY_ADDRESS`, or a Ray of this process).

        A Ray started here has no dashboard unless `init_options` asks for one, and a
        watchdog (`ray_watchdog`) that ends its processes if this process is killed; a Ray
        joined by address is never touched."""
        ray = _ray()
        with _INIT_LOCK:
            if not ray.is_initialized():
                address = self.address or os.environ.get("RAY_ADDRESS") or None
                options = {"log_to_driver": False, **self.init_options}
                local = address in (None, "local")  # a Ray started here, unless one is found
                if local:
                    options.setdefault("include_dashboard", False)
                context = ray.init(address=address, ignore_reinit_error=True, **options)
                session_dir = getattr(context, "address_info", {}).get("session_dir")
                if local and session_dir:  # watched only if its processes are this process's
                    ray_watchdog.watch(session_dir)
        return ray


@dataclass(eq=False)
class _Host:
    """A shared actor of a `RayBackend` with `per_actor` above 1."""

    actor: Any
    name: str
    live: int = 0
    """Instances alive in it (started or starting)."""
    slots: int = 0
    """Slots handed out so far (a slot is never reused)."""


@functools.cache
def _relay_class(ray: Any) -> Any:
    return ray.remote(_Relay)


def _start_error(ray: Any, error: BaseException, resources: dict, timeout: float) -> BaseException:
    if isinstance(error, ray.exceptions.GetTimeoutError):
        return SandboxError(
            f"no Ray node hosted a sandbox within {timeout:.0f} s (asked for "
            f"{resources or 'the defaults'}: is a node with these resources up and free?)"
        )
    if isinstance(error, ray.exceptions.RayTaskError):
        return SandboxError(f"the sandbox could not start on its Ray node: {error.cause}")
    if isinstance(error, ray.exceptions.RayError):
        return SandboxError(f"the sandbox's Ray actor failed while starting: {error}")
    if isinstance(error, Exception):
        return SandboxError(f"the sandbox could not start through Ray: {error!r}")
    return error  # KeyboardInterrupt and the like pass through


class RayChannel(Channel):
    """The host's end of a worker in a Ray actor: bytes relayed by actor calls, every one
    under a timeout; protocol checks here, as for any channel."""

    def __init__(
        self,
        actor: Any,
        actor_name: str,
        started: dict[str, Any],
        slot: int = 0,
        on_kill: Any = None,
    ) -> None:
        super().__init__()
        self.actor, self.actor_name = actor, actor_name
        self.slot = slot
        """The instance's slot in a shared actor (0: the actor is its own)."""
        self._on_kill = on_kill
        self.node_id, self.node_ip = started["node_id"], started["node_ip"]
        self.actor_pid: int = started["pid"]  # the actor's process, on its node
        self.isolation = _isolation(started, actor_name)
        self._inbox: deque[bytes | None] = deque()  # None: the worker's stream ended
        self._timed_out = False
        self._alive = True
        self._contact = time.monotonic()
        self._ended = ""  # why the actor is gone, when it is
        self._lost = False  # Ray reported the actor dead (a shared one fails all its slots)

    def _call(self, method: str, timeout: float, *args: Any) -> dict[str, Any]:
        """One actor call. A call past `timeout` raises TimeoutError (`Channel` kills the
        actor and raises SandboxTimeout); a dead actor or node raises `ActorLost`."""
        ray = _ray()
        if self.actor is None:
            raise ActorLost(f"{method}: {self._ended or 'the sandbox was killed'}")
        try:
            call = getattr(self.actor, method)
            result = ray.get(call.remote(*args, slot=self.slot), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self._ended = f"the Ray actor did not answer {method} within {timeout:.1f} s"
            raise TimeoutError(self._ended) from None
        except ray.exceptions.RayError as error:
            self._ended = f"the sandbox's Ray actor is gone: {_first_line(error)}"
            self._lost = True
            self.kill()
            raise ActorLost(f"{method}: {self._ended}") from None
        self._contact = time.monotonic()
        self._alive = bool(result.get("alive", True))
        return result

    def _write(self, data: bytes, timeout: float) -> None:
        self._inbox.clear()
        self._timed_out = False
        result = self._call("exchange", timeout + RAY_MARGIN, data, timeout)
        if result["before"]:
            extra = result["before"]
            self.kill()
            raise SandboxError(
                f"worker broke the protocol: {len(extra)} bytes nobody asked for "
                f"({extra[:80]!r}) before a request; worker killed"
            )
        if result["error"] == "write timeout":
            raise TimeoutError
        if result["error"] not in (None, "read timeout"):
            raise OSError(result["error"])
        self._receive(result)  # a read timeout is raised when the reply is read

    def _receive(self, result: dict[str, Any]) -> None:
        if result["data"]:
            self._inbox.append(result["data"])
        if result["eof"]:
            self._inbox.append(None)
        self._timed_out = result["error"] == "read timeout"

    def _read(self, timeout: float) -> bytes:
        if self._inbox:
            chunk = self._inbox.popleft()
            return b"" if chunk is None else chunk
        if self._timed_out:
            raise TimeoutError
        if timeout <= 0:  # the actor drained the stream after the last reply
            raise TimeoutError
        self._receive(self._call("read", timeout + RAY_MARGIN, timeout))
        if not self._inbox:
            raise TimeoutError
        chunk = self._inbox.popleft()
        return b"" if chunk is None else chunk

    @property
    def alive(self) -> bool:
        """The inner worker's state as of the last actor call; asked again (one round trip)
        when that was over a second ago."""
        if self._alive and time.monotonic() - self._contact > 1.0:
            try:
                self._call("state", RAY_MARGIN)
            except (TimeoutError, SandboxError):
                self._alive = False
        return self._alive

    def kill(self) -> None:
        """Stop the inner worker (its cgroup and scratch removed on the node), then the actor
        (a shared actor: when its last instance goes)."""
        self._alive = False
        actor, self.actor = self.actor, None
        if actor is None:
            return
        ray = _ray()
        with contextlib.suppress(Exception):
            ray.get(actor.kill.remote(slot=self.slot), timeout=2.0)
        if self._on_kill is not None:
            self._on_kill(lost=self._lost)
            return
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)

    def exit_description(self) -> str:
        if self.actor is not None:
            with contextlib.suppress(TimeoutError, SandboxError):
                return self._call("describe", RAY_MARGIN)["description"]
        return self._ended or "stream closed"

    def __repr__(self) -> str:
        return f"RayChannel({self.actor_name} on {self.node_ip})"


def _isolation(started: dict[str, Any], actor_name: str) -> RayIsolation:
    inner: Isolation = started["isolation"]
    where = f"on Ray node {started['node_id']} ({started['node_ip']}), actor {actor_name}"
    return RayIsolation(
        backend="ray",
        network=inner.network,
        filesystem=inner.filesystem,
        limits=dict(inner.limits),
        user=inner.user,
        notes=[where, *inner.notes],
        inner=inner.backend,
        node_id=started["node_id"],
        node_ip=started["node_ip"],
        actor=actor_name,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _inner_backend(inner: str | Backend) -> Backend:
    if not isinstance(inner, str):
        return inner
    if inner == "inline":
        return _InlineBackend()
    from toolgym.sandbox.process import ProcessBackend

    if inner == "process":
        return ProcessBackend()
    if inner == "local":
        return ProcessBackend(bubblewrap=False)
    if inner == "docker":
        from toolgym.sandbox.docker import DockerBackend

        return DockerBackend()
    raise ValueError(f"unknown inner sandbox {inner!r}; expected process, docker, local or inline")


class _InlineBackend:
    """Instances in the actor's own process (inner="inline")."""

    name = "inline"

    def start(self, target: type | None = None) -> Channel:
        if getattr(target, "runs_model_code", False):
            raise SandboxError(
                f"inner='inline' hosts no model code: {getattr(target, '__name__', target)} "
                "declares "
                "runs_model_code (use inner='process')"
            )
        return _InlineChannel()


class _InlineChannel(Channel):
    """An instance in the actor's own process behind the worker's request handler
    (`Worker.handle`): the same protocol, no isolation. Each request runs in a thread of its
    own under the request's timeout; past it the instance is dropped (the thread is left to
    finish: nothing in a process can be killed alone)."""

    def __init__(self) -> None:
        from toolgym.sandbox.worker import Worker

        super().__init__()
        self._out: deque[bytes] = deque()
        self._worker = Worker(reader=None, writer=self)  # type: ignore[arg-type]
        self._alive = True
        self.isolation = Isolation(
            backend="inline",
            network=True,
            filesystem="host",
            notes=["inline: in the Ray actor's own process, no isolation (trusted code only)"],
        )

    def write(self, data: bytes) -> None:  # the worker's writer
        self._out.append(bytes(data))

    def flush(self) -> None:
        pass

    def _write(self, data: bytes, timeout: float) -> None:
        if not self._alive:
            raise OSError("the inline instance was closed")
        for line in data.splitlines():
            replies: list[tuple[dict[str, Any], bool]] = []
            thread = threading.Thread(target=self._handle, args=(line, replies), daemon=True)
            thread.start()
            thread.join(timeout)
            if thread.is_alive():
                self._alive = False
                raise TimeoutError
            reply, last = replies[0]
            self._worker._send(reply)
            if last:
                self._alive = False

    def _handle(self, line: bytes, replies: list[tuple[dict[str, Any], bool]]) -> None:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as error:
            failure = {"type": "ValueError", "message": str(error)}
            replies.append(({"id": None, "ok": False, "error": failure}, False))
            return
        replies.append((self._worker.handle(request), request.get("op") == "exit"))

    def _read(self, timeout: float) -> bytes:
        if self._out:
            return self._out.popleft()
        if not self._alive:
            return b""
        raise TimeoutError

    @property
    def alive(self) -> bool:
        return self._alive

    def kill(self) -> None:
        self._alive = False


class _Relay:
    """The actor: hosts inner workers on its node (one per slot; slot 0 when the actor is the
    instance's own) and relays bytes; no protocol logic."""

    def __init__(self) -> None:
        self.channels: dict[int, Channel] = {}
        self._locks: dict[int, threading.Lock] = {}

    def start(
        self, inner: str | Backend, module: str | None, qualname: str | None, slot: int = 0
    ) -> dict:
        import ray

        target: Any = None
        if module is not None and qualname is not None:
            target = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
        channel = _inner_backend(inner).start(target)
        self._locks[slot] = threading.Lock()
        self.channels[slot] = channel
        context = ray.get_runtime_context()
        return {
            "isolation": channel.isolation,
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    def exchange(self, data: bytes, timeout: float, slot: int = 0) -> dict[str, Any]:
        """Send one request line and return the reply's bytes (read until a newline, then
        whatever else is waiting); bytes already waiting are returned unsent instead."""
        channel = self._channel(slot)
        with self._locks[slot]:
            before, eof = self._drain(channel)
            if before or eof:
                return self._result(channel, data=b"", eof=eof, before=before)
            try:
                channel._write(data, timeout)
            except TimeoutError:
                return self._result(channel, error="write timeout")
            except (OSError, ValueError) as error:
                return self._result(channel, error=f"{type(error).__name__}: {error}")
            return self._read_line(channel, time.monotonic() + timeout)

    def read(self, timeout: float, slot: int = 0) -> dict[str, Any]:
        """Bytes until a newline (or `timeout`), then whatever else is waiting."""
        channel = self._channel(slot)
        with self._locks[slot]:
            return self._read_line(channel, time.monotonic() + timeout)

    def state(self, slot: int = 0) -> dict[str, Any]:
        channel = self.channels.get(slot)
        return {"alive": channel is not None and channel.alive}

    def describe(self, slot: int = 0) -> dict[str, Any]:
        channel = self.channels.get(slot)
        description = channel.exit_description() if channel is not None else "no worker"
        return {"description": description, "alive": channel is not None and channel.alive}

    def kill(self, slot: int = 0) -> dict[str, Any]:
        channel = self.channels.pop(slot, None)
        if channel is not None:
            channel.kill()
        return {"alive": False}

    def _channel(self, slot: int) -> Channel:
        channel = self.channels.get(slot)
        if channel is None:
            raise RuntimeError("no worker was started in this actor's slot (or it was killed)")
        return channel

    def _read_line(self, channel: Channel, deadline: float) -> dict[str, Any]:
        """Bytes until a newline, or `MAX_REPLY_BYTES` of a longer line (the host reads the
        rest with `read`: a snapshot's line may be many times that), or `deadline`."""
        received, eof, error = bytearray(), False, None
        while len(received) <= MAX_REPLY_BYTES:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                chunk = channel._read(remaining)
            except TimeoutError:
                error = "read timeout"
                break
            except (OSError, ValueError) as failure:
                error = f"{type(failure).__name__}: {failure}"
                break
            if not chunk:
                eof = True
                break
            received += chunk
            if b"\n" in chunk:  # only the new bytes are searched: a long line reads linearly
                break
        if error is None and not eof:
            more, eof = self._drain(channel)
            received += more
        return self._result(channel, data=bytes(received), eof=eof, error=error)

    @staticmethod
    def _drain(channel: Channel) -> tuple[bytes, bool]:
        """What the worker has written that nobody read yet (without waiting), and whether
        its stream ended."""
        received = bytearray()
        while len(received) <= MAX_REPLY_BYTES:
            try:
                chunk = channel._read(0.0)
            except (TimeoutError, OSError, ValueError):
                return bytes(received), False
            if not chunk:
                return bytes(received), True
            received += chunk
        return bytes(received), False

    @staticmethod
    def _result(
        channel: Channel,
        data: bytes = b"",
        eof: bool = False,
        error: str | None = None,
        before: bytes = b"",
    ) -> dict[str, Any]:
        return {"data": data, "eof": eof, "error": error, "before": before, "alive": channel.alive}


def list_sandbox_actors() -> list[str]:
    """Names of this cluster's live sandbox actors (for checks that nothing was left)."""
    ray = _ray()
    return sorted(
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry.get("namespace") == NAMESPACE and entry["name"].startswith(ACTOR_PREFIX)
    )


__all__ = ["ActorLost", "RayBackend", "RayChannel", "RayIsolation", "list_sandbox_actors"]
