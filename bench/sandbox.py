"""Sandbox latency and pool start-up.

Prints, for the local, process and docker backends, the per-call latency (p50 / p99 over
`--calls` calls) of a trivial tool (`PythonREPL.run("1")` through `step`, so host-side
argument checking is included), the time of `reset` plus the first run on one instance
(a fresh worker per episode for `PythonREPL`), and the time until 32 instances are ready from
a cold pool and to lease 32 from a warm one. Targets: process under 2 ms p50, docker
under 5 ms p50.

`--concurrent N` instead starts process-backend PythonREPL workers one after another and
keeps them all alive (each ran `6 * 7`, so each has its session), until N are up, a start
fails (the uid pool is exhausted: one host uid per live worker, `toolgym.sandbox.identities`)
or the machine's available memory falls below `--memory-floor` GiB; it prints how many were
alive at once, how many distinct host uids they held, and the memory they took.

    python bench/sandbox.py [--calls 2000] [--pool 32] [--no-docker]
    python bench/sandbox.py --concurrent 1000 [--memory-floor 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

import toolgym
from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.sandbox import SandboxPool
from toolgym.sandbox.docker import docker_ready


def call_latency(where: str, calls: int) -> tuple[float, float]:
    env = toolgym.make("PythonREPL-v0", sandbox=where, max_turns=calls + 10)
    env.reset(seed=0)
    call = toolgym.ToolCall("run", {"code": "1"})
    for _ in range(20):  # warm-up
        env.step(call)
    env.reset(seed=0)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        env.step(call)
        times.append(time.perf_counter() - start)
    env.close()
    times.sort()
    return statistics.median(times) * 1e3, times[int(0.99 * (len(times) - 1))] * 1e3


def reset_latency(where: str, episodes: int) -> float:
    """Median seconds of `reset` on one instance: a class that runs the model's code gets a
    fresh worker for every episode after the first, so this is a worker's start."""
    env = toolgym.make("PythonREPL-v0", sandbox=where)
    env.reset(seed=0)
    env.step(toolgym.ToolCall("run", {"code": "1"}))
    times = []
    for _ in range(episodes):
        start = time.perf_counter()
        env.reset(seed=0)
        env.step(toolgym.ToolCall("run", {"code": "1"}))  # the first run starts the session
        times.append(time.perf_counter() - start)
    env.close()
    return statistics.median(times)


def pool_start(backend: str, size: int) -> tuple[float, float]:
    started = time.perf_counter()
    with SandboxPool(PythonREPL, backend=backend, size=size, start_threads=8) as pool:
        pool.wait_ready(timeout=600)
        cold = time.perf_counter() - started
        leased = [pool.lease() for _ in range(size)]
        for env in leased:
            env.close()
        started = time.perf_counter()
        leased = [pool.lease() for _ in range(size)]
        warm = time.perf_counter() - started
        for env in leased:
            env.close()
    return cold, warm


def available_gib() -> float:
    with open("/proc/meminfo") as info:
        fields = dict(line.split(":", 1) for line in info)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def concurrent_workers(limit: int, memory_floor: float) -> None:
    import re

    from toolgym.sandbox import ProcessBackend, RemoteEnvironment, SandboxError

    envs, uids, why = [], set(), f"reached --concurrent {limit}"
    available, started = available_gib(), time.perf_counter()
    try:
        while len(envs) < limit:
            if available_gib() < memory_floor:
                why = f"the machine's available memory fell below {memory_floor} GiB"
                break
            try:
                env = RemoteEnvironment(PythonREPL, backend=ProcessBackend())
                env.reset(task="t", answer="42")
                env.step(toolgym.ToolCall("run", {"code": "6 * 7"}))
            except SandboxError as error:
                why = f"a start failed: {error}"
                break
            envs.append(env)
            found = re.search(r"host uid (\d+)", env.isolation.user)
            uids.add(found.group(1) if found else env.isolation.user)
            if len(envs) % 50 == 0:
                print(f"  {len(envs)} alive, {available_gib():.1f} GiB available", flush=True)
        took = time.perf_counter() - started
        used = available - available_gib()
        print(
            f"process  concurrent PythonREPL workers: {len(envs)} alive at once, {len(uids)} "
            f"distinct host uids, {used:.1f} GiB taken ({used * 1024 / max(1, len(envs)):.0f} "
            f"MiB each), started in {took:.1f} s; stopped: {why}"
        )
    finally:
        for env in envs:
            env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=32)
    parser.add_argument("--no-docker", action="store_true")
    parser.add_argument("--concurrent", type=int, default=0)
    parser.add_argument("--memory-floor", type=float, default=6.0)
    args = parser.parse_args()
    if args.concurrent:
        concurrent_workers(args.concurrent, args.memory_floor)
        return
    backends = ["local", "process"]
    if not args.no_docker:
        if docker_ready():
            backends.append("docker")
        else:
            print("docker: no daemon or image (scripts/sandbox_setup.sh); skipped")
    for where in backends:
        p50, p99 = call_latency(where, args.calls)
        print(f"{where:8s} per call: p50 {p50:.3f} ms, p99 {p99:.3f} ms ({args.calls} calls)")
    for where in backends[1:]:
        reset = reset_latency(where, 20) * 1e3
        print(f"{where:8s} reset + first run on one instance: p50 {reset:.0f} ms")
    for where in backends[1:]:
        cold, warm = pool_start(where, args.pool)
        print(
            f"{where:8s} pool of {args.pool}: ready from cold in {cold:.2f} s; "
            f"{args.pool} leases from warm in {warm * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
