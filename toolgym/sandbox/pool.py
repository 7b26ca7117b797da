"""Warm pools of sandboxed environments: instances started before rollouts need them.

    with SandboxPool(PythonREPL, backend="docker", size=32) as pool:
        pool.wait_ready()                   # 32 containers up
        env = pool.lease()                  # a RemoteEnvironment, health-checked
        env.reset(seed=0); ...
        env.close()                         # back to the pool (reused through reset)

    trainer = GRPOTrainer(model, env=pool.lease, ...)   # one lease per rollout

A lease lasts at most `max_lease_seconds`; past that its worker is killed (the episode ends
with `env_error`, an infrastructure failure, even during a tool call) and the instance is not
reused. At most `max_instances` workers exist at
once; `lease` blocks (up to `timeout`) when all are out. An instance that fails its health
check, or has served `max_uses` leases, is replaced. A start that fails is retried with
backoff (1 s, doubling to 30 s); once `max_start_failures` starts in a row have failed and no
instance is left, `lease` and `wait_ready` raise `SandboxError` with the last start's error
instead of waiting.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolgym.sandbox.remote import Backend, RemoteEnvironment, SandboxError, ping


class SandboxPool:
    """A pool of `RemoteEnvironment`s of one class.

    Args:
        target: The environment class.
        kwargs: Its constructor arguments.
        backend: A backend or its name ("process", "docker", "auto").
        size: Instances kept warm (started at construction, in the background).
        max_instances: Most instances alive at once (leased + idle); default `size`.
        max_lease_seconds: Longest a lease may last before its worker is killed.
        max_uses: Leases an instance serves before it is replaced (0: no limit). None (the
            default): 1 for classes that declare `runs_model_code = True` (code the model wrote
            could have changed the worker for later episodes), else no limit.
        call_timeout: Seconds per request to a worker.
        start_threads: Workers started in parallel.
        max_start_failures: Failed starts in a row after which an empty pool gives up.
    """

    def __init__(
        self,
        target: type,
        kwargs: dict[str, Any] | None = None,
        backend: str | Backend = "auto",
        *,
        size: int = 8,
        max_instances: int | None = None,
        max_lease_seconds: float = 900.0,
        max_uses: int | None = None,
        call_timeout: float = 30.0,
        start_threads: int = 8,
        max_start_failures: int = 3,
    ) -> None:
        from toolgym.sandbox.backends import backend as resolve_backend

        chosen = resolve_backend(backend)
        if chosen is None:
            raise ValueError("a pool needs a process or docker backend, not 'local'")
        self.target, self.kwargs, self.backend = target, dict(kwargs or {}), chosen
        self.size, self.max_instances = size, max_instances or size
        if self.max_instances < size:
            raise ValueError(f"max_instances ({max_instances}) is below size ({size})")
        if max_uses is None:
            max_uses = 1 if getattr(target, "runs_model_code", False) else 0
        self.max_lease_seconds, self.max_uses = max_lease_seconds, max_uses
        self.call_timeout = call_timeout
        self._idle: deque[RemoteEnvironment] = deque()
        self._leases: dict[int, tuple[RemoteEnvironment, float]] = {}
        self._uses: dict[int, int] = {}
        self._starting = 0
        self._closed = False
        self._changed = threading.Condition()
        self._starter = ThreadPoolExecutor(start_threads, thread_name_prefix="toolgym-pool")
        self._watchdog = threading.Thread(target=self._expire_leases, daemon=True)
        self._watchdog.start()
        self.stats = {"started": 0, "replaced": 0, "expired": 0, "start_failures": 0}
        self.max_start_failures = max_start_failures
        self._failures_in_a_row = 0
        self.last_start_error: BaseException | None = None
        self._retry: threading.Timer | None = None
        self._top_up()

    # -- leasing ----------------------------------------------------------------------------
    def lease(self, timeout: float | None = None) -> RemoteEnvironment:
        """A healthy instance; blocks while `max_instances` are out. `close()` returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._changed:
                env = self._take_idle(deadline)
            if ping(env, timeout=5.0):
                with self._changed:
                    self._leases[id(env)] = (env, time.monotonic() + self.max_lease_seconds)
                    self._uses[id(env)] = self._uses.get(id(env), 0) + 1
                self._top_up()
                return env
            self._retire(env, "replaced")
            self._top_up()  # a dead instance is replaced, not just dropped

    def release(self, env: RemoteEnvironment) -> None:
        """Take an instance back (called by its `close()`); reused if healthy."""
        with self._changed:
            entry = self._leases.pop(id(env), None)
            if entry is None:  # expired (already retired) or not leased from this pool
                return
            reusable = (
                not self._closed
                and env.alive
                and (not self.max_uses or self._uses.get(id(env), 0) < self.max_uses)
            )
            if reusable:
                self._idle.append(env)
                self._changed.notify_all()
        if not reusable:
            self._retire(env, "replaced")
            self._top_up()

    def wait_ready(self, count: int | None = None, timeout: float = 300.0) -> None:
        """Block until `count` (default `size`) instances are idle and warm."""
        count = self.size if count is None else count
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._idle) < count:
                self._raise_if_failing()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{len(self._idle)} of {count} sandboxes ready")
                self._changed.wait(min(remaining, 1.0))

    @property
    def idle(self) -> int:
        """Instances ready to lease."""
        return len(self._idle)

    @property
    def leased(self) -> int:
        """Instances out on lease."""
        return len(self._leases)

    def placement(self) -> dict[str, int]:
        """Instances alive (idle and leased) per host: the Ray node's id for the `ray`
        backend (`RayIsolation.node_id`), "local" for a backend of this machine."""
        with self._changed:
            everyone = list(self._idle) + [env for env, _ in self._leases.values()]
        counts: dict[str, int] = {}
        for env in everyone:
            channel = getattr(env.executor, "channel", None)
            node = getattr(getattr(channel, "isolation", None), "node_id", "") or "local"
            counts[node] = counts.get(node, 0) + 1
        return counts

    def close(self) -> None:
        """Stop every instance, leased ones included."""
        with self._changed:
            self._closed = True
            everyone = list(self._idle) + [env for env, _ in self._leases.values()]
            self._idle.clear()
            self._leases.clear()
            self._changed.notify_all()
        if self._retry is not None:
            self._retry.cancel()
        self._starter.shutdown(wait=True, cancel_futures=True)
        for env in everyone:
            env.shutdown()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------
    def _take_idle(self, deadline: float | None) -> RemoteEnvironment:
        while not self._idle:
            if self._closed:
                raise SandboxError("the pool is closed")
            self._raise_if_failing()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no sandbox free within the timeout ({self.leased} leased)")
            self._changed.wait(remaining if remaining is not None else 1.0)
        return self._idle.pop()  # the most recently used first (warmest)

    def _raise_if_failing(self) -> None:
        """Called with the lock held: give up when starts keep failing and nothing is left."""
        nothing_left = not self._idle and not self._leases and not self._starting
        if nothing_left and self._failures_in_a_row >= self.max_start_failures:
            raise SandboxError(
                f"no sandbox of {self.target.__name__} could start ({self._failures_in_a_row} "
                f"failures in a row); the last: {self.last_start_error}"
            ) from self.last_start_error

    def _alive_count(self) -> int:
        return len(self._idle) + len(self._leases) + self._starting

    def _top_up(self) -> None:
        """Start workers until `size` are idle or starting, within `max_instances`."""
        with self._changed:
            if self._closed:
                return
            wanted = min(
                self.size - len(self._idle) - self._starting,
                self.max_instances - self._alive_count(),
            )
            self._starting += max(wanted, 0)
        for _ in range(max(wanted, 0)):
            self._starter.submit(self._start_one)

    def _start_one(self) -> None:
        env: RemoteEnvironment | None = None
        failure: Exception | None = None
        try:
            env = RemoteEnvironment(
                self.target,
                self.kwargs,
                backend=self.backend,
                call_timeout=self.call_timeout,
                pool=self,
            )
        except Exception as error:
            failure = error
        with self._changed:
            self._starting -= 1
            if failure is not None:
                self.stats["start_failures"] += 1
                self._failures_in_a_row += 1
                self.last_start_error = failure
                self._schedule_retry()
            elif env is not None and not self._closed:
                self._failures_in_a_row = 0
                self._idle.append(env)
                self.stats["started"] += 1
            self._changed.notify_all()
        if env is not None and self._closed:
            env.shutdown()

    def _retry_now(self) -> None:
        with self._changed:
            self._retry = None  # a failure from now on schedules the next retry
        self._top_up()

    def _schedule_retry(self) -> None:
        """Called with the lock held: top up again after a backoff (1 s doubling to 30 s)."""
        if self._closed or self._retry is not None:
            return
        delay = min(30.0, 2.0 ** (self._failures_in_a_row - 1))
        self._retry = threading.Timer(delay, self._retry_now)
        self._retry.daemon = True
        self._retry.start()

    def _retire(self, env: RemoteEnvironment, why: str) -> None:
        self.stats[why] += 1
        with self._changed:
            self._uses.pop(id(env), None)
            self._changed.notify_all()
        env.shutdown()

    def _expire_leases(self) -> None:
        while not self._closed:
            time.sleep(0.5)
            now = time.monotonic()
            with self._changed:
                expired = [env for env, until in self._leases.values() if until < now]
                for env in expired:
                    del self._leases[id(env)]
            for env in expired:
                env.revoked = f"the lease ran past max_lease_seconds ({self.max_lease_seconds} s)"
                self._retire(env, "expired")
            if expired:
                self._top_up()
