"""What a snapshot and a fork of a live episode cost, per backend (issue 46 item 2).

For Wordle mid-game, for an environment holding `--megabytes` of plain state, and for a
`PythonREPL` whose session holds about `--megabytes` of state the model's code built (bytes,
a list of lists of floats, a function, a class and its instances: copied as a session image),
on each backend asked for: `snapshot()` and `fork()` latency (median and p99 of `--forks`
tries) and the resident memory a fork adds (in this process for `local`; a sandboxed fork is a
new worker, whose memory is its own). A peer is the same episode built from scratch: `reset`
and replaying its calls (what a fork saves).

    python bench/forks.py                          # local and process, 100 forks each
    python bench/forks.py --backends local process docker --forks 20
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import toolgym
from toolgym import ToolCall


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _summary(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return f"median {statistics.median(values) * 1e3:8.2f} ms, p99 {p99 * 1e3:8.2f} ms"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def wordle(where: str):
    env = toolgym.make("Wordle-v0", sandbox=where)
    env.reset(seed=0, answer="crane")
    calls = [ToolCall("guess", {"word": w}) for w in ("slate", "moist")]
    for call in calls:
        env.step(call)
    return env, calls


def holder(where: str, megabytes: int):
    from sandbox_envs import Keeper

    env = toolgym.sandbox.sandboxed(Keeper, {}, where)
    env.reset()
    chunk = "x" * 500_000  # under a call's argument limit (1,000,000 characters)
    calls = [ToolCall("keep", {"text": chunk}) for _ in range(2 * megabytes)]
    for call in calls:
        assert not env.step(call).info["tool_failures"], "a call of the set-up failed"
    return env, calls


REPL_STATE = """
import os, random
random.seed(0)
blob = os.urandom({half} * 2**20)
rows = [[random.random() for _ in range(100)] for _ in range({rows})]
def total(values):
    return sum(map(sum, values))
class Account:
    def __init__(self, owner, balance):
        self.owner, self.balance = owner, balance
accounts = [Account(str(i), i) for i in range(1000)]
len(blob) + len(rows)
"""


def repl(where: str, megabytes: int):
    env = toolgym.make("PythonREPL-v0", sandbox=where)
    env.reset(task="t", answer="1")
    half = megabytes // 2  # the other half: floats, pickled at 9 bytes each (+ list framing)
    code = REPL_STATE.format(half=half, rows=half * 2**20 // 910)
    calls = [ToolCall("run", {"code": code})]
    for call in calls:
        result = env.step(call)
        assert "Traceback" not in result.messages[0]["content"], result.messages[0]["content"]
    return env, calls


def measure(name: str, build, forks: int) -> None:
    from toolgym.envs.snapshots import NotForkable

    env, calls = build()
    try:
        env.snapshot()
    except NotForkable as error:
        print(f"{name:28} not forkable: {error}")
        env.close()
        return
    try:
        snapshots = [_seconds(env.snapshot) for _ in range(forks)]
        rss_before = _rss_mib()
        made = []
        fork_times = []
        for _ in range(forks):
            started = time.perf_counter()
            made.extend(env.fork())
            fork_times.append(time.perf_counter() - started)
            if len(made) >= 8:  # keep a few alive for memory, close the rest as we go
                made.pop(0).close()
        grown = _rss_mib() - rss_before
        for copy in made:
            copy.close()
        replays = []
        for _ in range(min(forks, 20)):
            fresh, _ = build()
            replays.append(_seconds(lambda fresh=fresh: [fresh.step(c) for c in calls]))
            fresh.close()
        print(f"{name:28} snapshot {_summary(snapshots)}")
        print(f"{'':28} fork     {_summary(fork_times)}; peak RSS here +{grown:.0f} MiB")
        print(f"{'':28} replay   {_summary(replays)} (the peer: its calls again on a fresh one)")
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["local", "process"])
    parser.add_argument("--forks", type=int, default=100)
    parser.add_argument("--megabytes", type=int, default=100)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.forks} tries each")
    for where in args.backends:
        measure(f"Wordle, {where}", lambda where=where: wordle(where), args.forks)
        measure(
            f"{args.megabytes} MB of state, {where}",
            lambda where=where: holder(where, args.megabytes),
            max(5, args.forks // 10),
        )
        measure(
            f"REPL, {args.megabytes} MB, {where}",
            lambda where=where: repl(where, args.megabytes),
            max(5, args.forks // 10),
        )


if __name__ == "__main__":
    main()
