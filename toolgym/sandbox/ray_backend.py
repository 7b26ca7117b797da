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
(`ray.init()`). Ray is an optional extra: `pip install toolgym[ray]`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

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


class ActorLost(SandboxError):
    """The sandbox's Ray actor is gone: killed, or its node died: the infrastructure's doing,
    never the model's (the episode is left out of baselines and the loss)."""

    infrastructure = True


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
            process backend's limits but without bubblewrap) or a backend object (pickled to
            the node).
        start_timeout: Seconds for Ray to place the actor and for the inner worker to start.
        runtime_env: Ray's runtime environment for the actors (e.g. `py_modules` for an
            environment class that the nodes cannot import otherwise).
        init_options: Further arguments for `ray.init` when this backend starts Ray.
        spread: Place the actors with Ray's SPREAD strategy: each new actor on the feasible
            node that hosts the fewest, so that a pool's instances are spread over the
            cluster's nodes. Ray's default strategy fills the node of the caller first (up to
            half its resources) and packs, which keeps a small pool on one node; it matters
            for pools, not for a single instance or for actors pinned by a custom resource
            that one node has.
    """

    address: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    inner: str | Backend = "process"
    start_timeout: float = 120.0
    runtime_env: dict[str, Any] | None = None
    init_options: dict[str, Any] = field(default_factory=dict)
    spread: bool = False
    name: str = "ray"

    def __post_init__(self) -> None:
        for key, value in self.resources.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"RayBackend resources: {key}={value!r} is not a non-negative number"
                )

    def start(self, target: type | None = None) -> RayChannel:
        """A new actor hosting a worker for `target`, after the worker's hello."""
        ray = self.connect()
        actor_name = ACTOR_PREFIX + uuid.uuid4().hex[:12]
        options = {k: v for k, v in self.resources.items() if k in _KINDS}
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
                max_concurrency=2,  # `kill` is served while an exchange waits on the worker
                max_restarts=0,
                **options,
            )
            .remote()
        )
        module = target.__module__ if target is not None else None
        qualname = target.__qualname__ if target is not None else None
        try:
            started = ray.get(
                actor.start.remote(self.inner, module, qualname), timeout=self.start_timeout
            )
        except BaseException as error:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise _start_error(ray, error, self.resources, self.start_timeout) from error
        return RayChannel(actor, actor_name, started)

    def connect(self) -> Any:
        """Ray, initialised (joining `address`, `RAY_ADDRESS`, or a Ray of this process)."""
        ray = _ray()
        with _INIT_LOCK:
            if not ray.is_initialized():
                address = self.address or os.environ.get("RAY_ADDRESS") or None
                options = {"log_to_driver": False, **self.init_options}
                ray.init(address=address, ignore_reinit_error=True, **options)
        return ray


@functools.cache
def _relay_class(ray: Any) -> Any:
    return ray.remote(_Relay)


def _start_error(ray: Any, error: BaseException, resources: dict, timeout: float) -> Exception:
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
    return error  # KeyboardInterrupt and the like pass through  # type: ignore[return-value]


class RayChannel(Channel):
    """The host's end of a worker in a Ray actor: bytes relayed by actor calls, every one
    under a timeout; protocol checks here, as for any channel."""

    def __init__(self, actor: Any, actor_name: str, started: dict[str, Any]) -> None:
        super().__init__()
        self.actor, self.actor_name = actor, actor_name
        self.node_id, self.node_ip = started["node_id"], started["node_ip"]
        self.actor_pid: int = started["pid"]  # the actor's process, on its node
        self.isolation = _isolation(started, actor_name)
        self._inbox: deque[bytes | None] = deque()  # None: the worker's stream ended
        self._timed_out = False
        self._alive = True
        self._contact = time.monotonic()
        self._ended = ""  # why the actor is gone, when it is

    def _call(self, method: str, timeout: float, *args: Any) -> dict[str, Any]:
        """One actor call. A call past `timeout` raises TimeoutError (`Channel` kills the
        actor and raises SandboxTimeout); a dead actor or node raises `ActorLost`."""
        ray = _ray()
        if self.actor is None:
            raise ActorLost(f"{method}: {self._ended or 'the sandbox was killed'}")
        try:
            result = ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self._ended = f"the Ray actor did not answer {method} within {timeout:.1f} s"
            raise TimeoutError(self._ended) from None
        except ray.exceptions.RayError as error:
            self._ended = f"the sandbox's Ray actor is gone: {_first_line(error)}"
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
        """Stop the inner worker (its cgroup and scratch removed on the node), then the actor."""
        self._alive = False
        actor, self.actor = self.actor, None
        if actor is None:
            return
        ray = _ray()
        with contextlib.suppress(Exception):
            ray.get(actor.kill.remote(), timeout=2.0)
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
    from toolgym.sandbox.process import ProcessBackend

    if inner == "process":
        return ProcessBackend()
    if inner == "local":
        return ProcessBackend(bubblewrap=False)
    if inner == "docker":
        from toolgym.sandbox.docker import DockerBackend

        return DockerBackend()
    raise ValueError(f"unknown inner sandbox {inner!r}; expected process, docker or local")


class _Relay:
    """The actor: hosts one inner worker on its node and relays bytes; no protocol logic."""

    def __init__(self) -> None:
        self.channel: Channel | None = None
        self._lock = threading.Lock()

    def start(self, inner: str | Backend, module: str | None, qualname: str | None) -> dict:
        import ray

        target = None
        if module is not None and qualname is not None:
            target = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
        self.channel = _inner_backend(inner).start(target)
        context = ray.get_runtime_context()
        return {
            "isolation": self.channel.isolation,
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    def exchange(self, data: bytes, timeout: float) -> dict[str, Any]:
        """Send one request line and return the reply's bytes (read until a newline, then
        whatever else is waiting); bytes already waiting are returned unsent instead."""
        channel = self._channel()
        with self._lock:
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

    def read(self, timeout: float) -> dict[str, Any]:
        """Bytes until a newline (or `timeout`), then whatever else is waiting."""
        channel = self._channel()
        with self._lock:
            return self._read_line(channel, time.monotonic() + timeout)

    def state(self) -> dict[str, Any]:
        return {"alive": self.channel is not None and self.channel.alive}

    def describe(self) -> dict[str, Any]:
        channel = self.channel
        description = channel.exit_description() if channel is not None else "no worker"
        return {"description": description, "alive": channel is not None and channel.alive}

    def kill(self) -> dict[str, Any]:
        if self.channel is not None:
            self.channel.kill()
        return {"alive": False}

    def _channel(self) -> Channel:
        if self.channel is None:
            raise RuntimeError("no worker was started in this actor")
        return self.channel

    def _read_line(self, channel: Channel, deadline: float) -> dict[str, Any]:
        received, eof, error = b"", False, None
        while b"\n" not in received and len(received) <= MAX_REPLY_BYTES:
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
        if error is None and not eof:
            more, eof = self._drain(channel)
            received += more
        return self._result(channel, data=received, eof=eof, error=error)

    @staticmethod
    def _drain(channel: Channel) -> tuple[bytes, bool]:
        """What the worker has written that nobody read yet (without waiting), and whether
        its stream ended."""
        received = b""
        while len(received) <= MAX_REPLY_BYTES:
            try:
                chunk = channel._read(0.0)
            except (TimeoutError, OSError, ValueError):
                return received, False
            if not chunk:
                return received, True
            received += chunk
        return received, False

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
