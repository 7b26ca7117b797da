"""Environments on a Ray cluster: a thousand concurrent episodes through toolgym's agent loop.

Starts a local two-node Ray cluster on loopback (a head and a second node process, as the
tests do; `--address` or `RAY_ADDRESS` joins an existing cluster instead), keeps `--episodes`
instances of a simulated environment warm in a `SandboxPool` of Ray actors (`RayBackend`,
`--per-actor` instances per actor, `inner="inline"` by default: the simulated environment is
trusted code, so it lives in the actor's process), and plays every episode at once through
`Agent.run` with a scripted engine (no model: the figures are the framework's). Each episode
makes `--calls` tool calls; each call waits a latency drawn log-uniformly from 1 ms to 2 s (a
remote API, a build, a test run) and reports how long it took. Prints:

- instances started per second (a cold pool until all are warm);
- host-side call overhead, p50 / p99: the host's round trip of a tool call (argument checks,
  JSON, Ray's round trip, the actor's relay) minus the tool's own time;
- the agent loop's overhead per episode: the episode's wall time minus its time in the
  environment's requests and in the engine (queueing for threads and the event loop,
  rendering, parsing);
- peak memory of the driver and of every process of the run (RSS summed: shared pages count
  more than once);
- the same workload through today's process pool (bubblewrap workers on this host) at
  `--process-size` instances (`--process-size` at a time), and the ratio of episodes/s.

Figures are printed, never asserted (tests/test_bench.py runs a tiny size). The last line
reads `episodes/s E, overhead p99 P ms` (the Ray run's).

    python bench/cluster.py [--episodes 1000] [--per-actor 125] [--calls 3]
                            [--process-size 48] [--inner inline|local|process] [--address A]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import toolgym  # light: the actors and the process workers import this module too

BENCH = Path(__file__).resolve().parent
LOOPBACK = "127.0.0.2"  # not 127.0.0.1, which Ray replaces with the outward address
LOW, HIGH = 0.001, 2.0


class SimulatedTools(toolgym.Environment):
    """A simulated tool environment: every call waits a latency drawn log-uniformly from 1 ms
    to 2 s (seeded by the episode and step: every run plays the same latencies), as a remote
    API or a build would, and says how long it took."""

    def reset(self, episode: int = 0, **_: Any) -> str:
        self.episode = episode
        return "ready"

    def work(self, step: int) -> str:
        """Do one step of simulated work.

        Args:
            step: Which step of the task this is.
        """
        draw = random.Random(f"{self.episode}/{step}")  # the same workload in every run
        latency = math.exp(draw.uniform(math.log(LOW), math.log(HIGH)))
        started = time.perf_counter()
        time.sleep(latency)
        return f"step {step} took {time.perf_counter() - started:.6f} s"


# -- a local cluster ----------------------------------------------------------------------------
class LocalCluster:
    """A head node and a second node process on loopback, each `ray start --block` in a
    process group of its own; stopped by process id, orphans found by our temp folder."""

    def __init__(self, cpus: int) -> None:
        self.tmp = tempfile.mkdtemp(prefix="tgbench", dir="/tmp")  # short: socket paths
        self.env = {**os.environ, "RAY_TMPDIR": self.tmp}
        self.env.pop("RAY_ADDRESS", None)
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            self.port = probe.getsockname()[1]
        self.address = f"{LOOPBACK}:{self.port}"
        ray = str(Path(sys.executable).with_name("ray"))
        common = [f"--num-cpus={cpus}", f"--node-ip-address={LOOPBACK}", "--block"]
        common += ["--disable-usage-stats", f"--temp-dir={self.tmp}"]
        head = [ray, "start", "--head", f"--port={self.port}", "--include-dashboard=false"]
        self.nodes = [self._start(head + common)]
        self.nodes.append(self._start([ray, "start", f"--address={self.address}", *common]))

    def _start(self, command: list[str]) -> subprocess.Popen:
        name = f"node{len(getattr(self, 'nodes', []))}.log"
        with open(os.path.join(self.tmp, name), "ab") as log:
            return subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def connect(self, ray: Any, nodes: int = 2, seconds: float = 120) -> None:
        os.environ["RAY_TMPDIR"] = self.tmp
        deadline = time.monotonic() + seconds
        while True:
            try:
                ray.init(address=self.address, log_to_driver=False)
                break
            except (ConnectionError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        while sum(node["Alive"] for node in ray.nodes()) < nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster's nodes did not join (logs in {self.tmp})")
            time.sleep(0.5)

    def processes(self) -> list[int]:
        return descendants([node.pid for node in self.nodes]) + ours(self.tmp)

    def stop(self) -> None:
        for _ in range(3):
            for pid in self.processes():
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        kill(pid, signal.SIGKILL)
            for node in self.nodes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.wait(timeout=5)
            if not ours(self.tmp):
                break
            time.sleep(0.5)
        shutil.rmtree(self.tmp, ignore_errors=True)


def descendants(roots: list[int]) -> list[int]:
    """`roots` and every process below them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def ours(tmp: str) -> list[int]:
    """Processes whose environment names our Ray temp folder (orphans of a node included)."""
    mine = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                if f"RAY_TMPDIR={tmp}".encode() in environ.split(b"\0"):
                    mine.append(int(entry))
    return mine


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in set(pids):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


class MemoryPeak:
    """The peak of the summed RSS of the driver, its descendants and `extra()`'s processes,
    sampled every 0.2 s while in use."""

    def __init__(self, extra: Any = list) -> None:
        self.extra, self.peak, self._stop = extra, 0.0, threading.Event()

    def __enter__(self) -> MemoryPeak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            pids = descendants([os.getpid()]) + list(self.extra())
            self.peak = max(self.peak, rss_mib(pids))
            self._stop.wait(0.2)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by the driver, and by every other process of the run
        (alive now: the sandbox workers, the cluster's processes)."""
        own = os.times()
        others = set(descendants([os.getpid()]) + list(self.extra())) - {os.getpid()}
        ticks = 0
        for pid in others:
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return own.user + own.system, ticks / os.sysconf("SC_CLK_TCK")


def driver_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- what the run measures ----------------------------------------------------------------------
@dataclass
class Timings:
    """Host-side times of every request, per executor, and the overhead of every tool call."""

    host: dict[int, float] = field(default_factory=dict)
    overheads: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, executor: Any, seconds: float, own: str | None = None) -> None:
        """`seconds` of a request of `executor`; for a tool call, `own` is its content."""
        found = re.search(r"took ([0-9.]+) s", own) if own is not None else None
        with self.lock:
            self.host[id(executor)] = self.host.get(id(executor), 0.0) + seconds
            if found:
                self.overheads.append(seconds - float(found.group(1)))

    @contextlib.contextmanager
    def installed(self):
        """Time every request of a sandboxed instance (`RemoteExecutor.request`; tool calls
        through `run`: the host's round trip minus the time the tool reports) and the same
        of an in-process one (`LocalExecutor.reset` and `arun`)."""
        from toolgym.envs.stepping import LocalExecutor
        from toolgym.sandbox.remote import RemoteExecutor

        saved = [
            (RemoteExecutor, "request"), (RemoteExecutor, "run"),
            (LocalExecutor, "reset"), (LocalExecutor, "arun"),
        ]  # fmt: skip
        originals = {(cls, name): getattr(cls, name) for cls, name in saved}
        request, run = RemoteExecutor.request, RemoteExecutor.run
        local_reset, local_arun = LocalExecutor.reset, LocalExecutor.arun
        timings, calls = self, threading.local()

        def timed_request(executor, *args, **kwargs):
            started = time.perf_counter()
            try:
                return request(executor, *args, **kwargs)
            finally:
                if not getattr(calls, "inside", False):
                    timings.add(executor, time.perf_counter() - started)

        def timed_run(executor, call, arguments):
            started, calls.inside = time.perf_counter(), True
            try:
                result = run(executor, call, arguments)
            finally:
                calls.inside = False
            timings.add(executor, time.perf_counter() - started, str(result.content))
            return result

        def timed_reset(executor, row):
            started = time.perf_counter()
            try:
                return local_reset(executor, row)
            finally:
                timings.add(executor, time.perf_counter() - started)

        async def timed_arun(executor, call, arguments):
            started = time.perf_counter()
            result = await local_arun(executor, call, arguments)
            timings.add(executor, time.perf_counter() - started, str(result.content))
            return result

        RemoteExecutor.request, RemoteExecutor.run = timed_request, timed_run
        LocalExecutor.reset, LocalExecutor.arun = timed_reset, timed_arun
        try:
            yield self
        finally:
            for (cls, name), original in originals.items():
                setattr(cls, name, original)


def executor_of(env: Any) -> Any:
    """The executor of a stepped instance (sandboxed or in this process)."""
    return env.executor


def scripted_engine(tokenizer: Any, calls: int) -> Any:
    """Call `work` `calls` times, then answer (the count read from the prompt so far)."""
    from toolgym.agents import ScriptedEngine

    def script(prompt_ids: list[int]) -> list[int]:
        done = tokenizer.decode(prompt_ids).count(" took ")
        if done >= calls:
            text = "All steps are done.<|im_end|>"
        else:
            text = (
                '<tool_call>\n{"name": "work", "arguments": {"step": ' + str(done) + "}}\n"
                "</tool_call><|im_end|>"
            )
        return tokenizer.encode(text, add_special_tokens=False)

    return ScriptedEngine(script, tokenizer=tokenizer)


def rows(count: int) -> list[dict[str, Any]]:
    prompt = [{"role": "user", "content": "Do the task step by step with the work tool."}]
    return [{"prompt": prompt, "episode": i} for i in range(count)]


def agent(tokenizer: Any, calls: int, threads: int) -> Any:
    from toolgym.agents import Agent, AgentLimits

    limits = AgentLimits(max_turns=calls + 1, max_new_tokens=64, max_episode_tokens=2048)
    return Agent(
        scripted_engine(tokenizer, calls),
        tokenizer,
        parser="hermes",
        limits=limits,
        tool_threads=threads,
    )


@dataclass
class Result:
    name: str
    instances: int
    start_seconds: float
    episodes: int
    concurrent: int
    wall: float
    overheads: list[float]
    loop_overheads: list[float]
    statuses: dict[str, int]
    peak_mib: float
    cpu: tuple[float, float] = (math.nan, math.nan)
    """CPU seconds of the episodes: the driver's, and every other process's."""

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall

    def lines(self) -> list[str]:
        call = percentiles(self.overheads)
        loop = percentiles(self.loop_overheads)
        return [
            f"{self.name:8s} start: {self.instances} instances warm in {self.start_seconds:.1f} s "
            f"({self.instances / self.start_seconds:.1f} instances/s)",
            f"{self.name:8s} {self.episodes} episodes, {self.concurrent} at a time: "
            f"{self.wall:.1f} s, {self.episodes_per_s:.1f} episodes/s; statuses {self.statuses}",
            f"{self.name:8s} call overhead (host round trip - tool time): p50 {call[0]:.2f} ms, "
            f"p99 {call[1]:.2f} ms ({len(self.overheads)} calls)",
            f"{self.name:8s} agent loop overhead per episode: p50 {loop[0]:.1f} ms, "
            f"p99 {loop[1]:.1f} ms",
            f"{self.name:8s} CPU per episode: driver {self.cpu[0] / self.episodes * 1e3:.1f} ms, "
            f"other processes {self.cpu[1] / self.episodes * 1e3:.1f} ms",
            f"{self.name:8s} peak memory, every process of the run: {self.peak_mib:.0f} MiB",
        ]


def percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.median(ordered) * 1e3, p99 * 1e3


def play(
    name: str,
    pool: Any,
    size: int,
    episodes: int,
    calls: int,
    tokenizer: Any,
    memory: MemoryPeak,
    started: float,
) -> Result:
    """Play `episodes` episodes, `size` at a time: one `Agent.run` over all of them when
    `size` is `episodes` (leased before the clock starts), else `size` threads each leasing
    an instance and playing its episodes in turn."""
    pool.wait_ready(timeout=1800)
    start_seconds = time.perf_counter() - started
    timings = Timings()
    if size >= episodes:
        envs = [pool.lease(timeout=300) for _ in range(episodes)]
        before = memory.cpu()
        with timings.installed():
            trajectories, seconds, busy, wall = _all_at_once(envs, calls, tokenizer, timings)
        after = memory.cpu()
        for env in envs:
            env.close()
    else:
        before = memory.cpu()
        with timings.installed():
            trajectories, seconds, busy, wall = _in_turns(
                pool, size, episodes, calls, tokenizer, timings
            )
        after = memory.cpu()
    result = _result(
        name, pool.size, start_seconds, size, trajectories, seconds, busy, wall, timings, memory
    )
    result.cpu = (after[0] - before[0], after[1] - before[1])
    return result


def _all_at_once(envs: list, calls: int, tokenizer: Any, timings: Timings) -> tuple:
    """Every episode in one `Agent.run`: trajectories, each episode's wall seconds and time
    in requests, and the run's wall seconds."""
    ends: dict[int, float] = {}

    def ended(trajectory: Any) -> None:
        ends[trajectory.row["episode"]] = time.perf_counter()

    player = agent(tokenizer, calls, len(envs) + 16)
    began = time.perf_counter()
    trajectories = player.run(envs, rows(len(envs)), on_episode_end=ended)
    wall = time.perf_counter() - began
    seconds = {episode: end - began for episode, end in ends.items()}
    busy = {i: timings.host.get(id(executor_of(env)), 0.0) for i, env in enumerate(envs)}
    return trajectories, seconds, busy, wall


def _in_turns(
    pool: Any, size: int, episodes: int, calls: int, tokenizer: Any, timings: Timings
) -> tuple:
    """`size` threads, each leasing an instance per episode and playing it."""
    todo, lock = rows(episodes), threading.Lock()
    trajectories: list = []
    seconds: dict[int, float] = {}
    busy: dict[int, float] = {}

    def worker() -> None:
        player = agent(tokenizer, calls, 4)
        while True:
            with lock:
                if not todo:
                    return
                row = todo.pop()
            begun = time.perf_counter()
            env = pool.lease(timeout=300)
            before = timings.host.get(id(env.executor), 0.0)
            (trajectory,) = player.run([env], [row])
            seconds[row["episode"]] = time.perf_counter() - begun
            busy[row["episode"]] = timings.host.get(id(env.executor), 0.0) - before
            env.close()
            with lock:
                trajectories.append(trajectory)

    began = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return trajectories, seconds, busy, time.perf_counter() - began


def local_run(args: argparse.Namespace, tokenizer: Any) -> Result:
    """The same episodes, all at once, with every instance in this process: the agent loop's
    own cost at this concurrency, without any sandbox or Ray."""
    env_class = importlib.import_module("cluster").SimulatedTools
    timings = Timings()
    with MemoryPeak() as memory:
        started = time.perf_counter()
        envs = [toolgym.as_environment(env_class()) for _ in range(args.episodes)]
        start_seconds = time.perf_counter() - started
        before = memory.cpu()
        with timings.installed():
            trajectories, seconds, busy, wall = _all_at_once(envs, args.calls, tokenizer, timings)
        after = memory.cpu()
    result = _result(
        "local", args.episodes, start_seconds, args.episodes, trajectories, seconds, busy,
        wall, timings, memory,
    )  # fmt: skip
    result.cpu = (after[0] - before[0], after[1] - before[1])
    return result


def _result(
    name: str,
    instances: int,
    start_seconds: float,
    size: int,
    trajectories: list,
    seconds: dict[int, float],
    busy: dict[int, float],
    wall: float,
    timings: Timings,
    memory: MemoryPeak,
) -> Result:
    loop_overheads = []
    for trajectory in trajectories:
        episode = trajectory.row["episode"]
        engine = trajectory.metrics.get("generation_seconds", 0.0)
        loop_overheads.append(max(0.0, seconds[episode] - busy[episode] - engine))
    statuses: dict[str, int] = {}
    for trajectory in trajectories:
        statuses[trajectory.status] = statuses.get(trajectory.status, 0) + 1
    return Result(
        name,
        instances,
        start_seconds,
        len(trajectories),
        size,
        wall,
        timings.overheads,
        loop_overheads,
        statuses,
        memory.peak,
    )


def ray_run(args: argparse.Namespace, tokenizer: Any) -> tuple[Result, Result | None, str]:
    import ray

    from toolgym.sandbox import SandboxPool
    from toolgym.sandbox.ray_backend import RayBackend, list_sandbox_actors

    env_class = importlib.import_module("cluster").SimulatedTools  # importable by the actors
    cluster = None
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        cluster = LocalCluster(cpus=args.node_cpus)
        cluster.connect(ray)
    try:
        nodes = [node for node in ray.nodes() if node["Alive"]]
        actors = math.ceil(args.episodes / args.per_actor)
        backend = RayBackend(
            inner=args.inner,
            per_actor=args.per_actor,
            spread=True,
            resources={"num_cpus": args.actor_cpus},
            runtime_env={"env_vars": {"PYTHONPATH": str(BENCH)}},
        )
        where = (
            f"cluster: {len(nodes)} nodes ({'loopback, this machine' if cluster else address}); "
            f"{actors} actors x {args.per_actor} instances (inner={args.inner})"
        )
        extra = cluster.processes if cluster is not None else list
        with MemoryPeak(extra) as memory:
            started = time.perf_counter()
            pool = SandboxPool(
                env_class, backend=backend, size=args.episodes, start_threads=args.start_threads
            )
            try:
                result = play(
                    "ray", pool, args.episodes, args.episodes, args.calls, tokenizer, memory,
                    started,
                )  # fmt: skip
                placement = pool.placement()
                paced = None
                if 0 < args.process_size < args.episodes:  # as the process pool plays them
                    paced = play(
                        "ray", pool, args.process_size, args.episodes, args.calls, tokenizer,
                        memory, started,
                    )  # fmt: skip
            finally:
                pool.close()
        where += "; instances per node: " + ", ".join(str(n) for n in placement.values())
        deadline = time.monotonic() + 60
        while list_sandbox_actors() and time.monotonic() < deadline:
            time.sleep(0.5)
        if list_sandbox_actors():
            where += f"; ACTORS LEFT: {len(list_sandbox_actors())}"
        return result, paced, where
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.stop()


def process_run(args: argparse.Namespace, tokenizer: Any) -> Result:
    from toolgym.sandbox import SandboxPool
    from toolgym.sandbox.process import ProcessBackend

    env_class = importlib.import_module("cluster").SimulatedTools
    with MemoryPeak() as memory:
        started = time.perf_counter()
        with SandboxPool(
            env_class,
            backend=ProcessBackend(),
            size=args.process_size,
            start_threads=args.start_threads,
        ) as pool:
            return play(
                "process", pool, args.process_size, args.episodes, args.calls, tokenizer, memory,
                started,
            )  # fmt: skip


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000, help="concurrent episodes on Ray")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per episode")
    parser.add_argument("--per-actor", type=int, default=125, help="instances per Ray actor")
    parser.add_argument("--inner", default="inline", help="inline, local or process")
    parser.add_argument("--actor-cpus", type=float, default=0.5, help="CPUs each actor asks")
    parser.add_argument("--node-cpus", type=int, default=4, help="logical CPUs per local node")
    parser.add_argument("--start-threads", type=int, default=32)
    parser.add_argument("--process-size", type=int, default=48, help="0: no process pool")
    parser.add_argument(
        "--address", help="a Ray cluster to join (default: RAY_ADDRESS, else local)"
    )
    parser.add_argument(
        "--no-local", dest="local", action="store_false", help="skip the in-process peer"
    )
    args = parser.parse_args(argv)
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    from toolgym.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    lines = []
    ray_result, paced, where = ray_run(args, tokenizer)
    lines += [where, *ray_result.lines()]
    if paced is not None:
        lines += paced.lines()[1:-1]  # the same pool and memory: start and peak as above
    for line in lines:
        print(line, flush=True)
    if args.process_size:
        process_result = process_run(args, tokenizer)
        more = process_result.lines()
        ratio = ray_result.episodes_per_s / process_result.episodes_per_s
        more.append(
            f"ray/process episodes/s: {ratio:.2f}x ({args.episodes} concurrent on Ray vs "
            f"{args.process_size} process workers)"
        )
        if paced is not None:
            ratio = paced.episodes_per_s / process_result.episodes_per_s
            more.append(f"ray/process episodes/s, {args.process_size} at a time each: {ratio:.2f}x")
        for line in more:
            print(line, flush=True)
        lines += more
    print(f"driver peak memory (ru_maxrss, whole run): {driver_peak_mib():.0f} MiB", flush=True)
    if args.local:
        local_result = local_run(args, tokenizer)
        more = local_result.lines()[1:]
        ratio = ray_result.episodes_per_s / local_result.episodes_per_s
        more.append(f"ray/local episodes/s: {ratio:.2f}x (the same loop, instances in-process)")
        for line in more:
            print(line, flush=True)
        lines += more
    p99 = percentiles(ray_result.overheads)[1]
    last = f"episodes/s {ray_result.episodes_per_s:.1f}, overhead p99 {p99:.2f} ms"
    print(last, flush=True)
    return [*lines, last]


if __name__ == "__main__":
    main()
