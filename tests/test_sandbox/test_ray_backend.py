"""The Ray backend on a real two-node Ray cluster started on this machine: environments placed
on a chosen node, calls checked on the host, a killed actor or node ending the call with a
named failure (never a hang), and nothing left behind (no actor, no Ray process, no temp
folder). The attack suite through a Ray-hosted sandbox is `test_ray_attacks.py`; pools across
the nodes, faults mid-episode and a GRPO step are `test_ray_pool.py` (both reuse `Cluster`).

Skips with the reason when Ray is not installed (`pip install 'toolgym[ray]'`), unless
TOOLGYM_REQUIRE_SANDBOXES=1.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import toolgym
from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.sandbox import sandboxed
from toolgym.sandbox.remote import SandboxError

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"
try:
    import ray
except ImportError as error:
    if REQUIRED:
        raise
    pytest.skip(
        f"Ray is not installed ({error}; pip install 'toolgym[ray]')", allow_module_level=True
    )
if shutil.which("bwrap") is None and not REQUIRED:
    pytest.skip("bubblewrap is not installed (the inner process sandbox)", allow_module_level=True)


from toolgym.sandbox.ray_backend import RayBackend, RayIsolation, list_sandbox_actors  # noqa: E402

pytestmark = pytest.mark.slow
LOOPBACK = "127.0.0.2"
"""The nodes' address: on the loopback device, but not the literal 127.0.0.1, which Ray
replaces with the machine's outward address."""


def _descendants(roots: list[int]) -> list[int]:
    """`roots` and every process below them (Ray's workers start sessions of their own)."""
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


def _ours(tmp: str) -> list[int]:
    """Processes whose environment names our Ray temp folder (orphans included)."""
    mine = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if f"RAY_TMPDIR={tmp}".encode() in environ.split(b"\0"):
                mine.append(int(entry))
    return mine


def _kill(pids: list[int]) -> None:
    for pid in pids:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


class Cluster:
    """A head node (resource "a") and a second node (resource "b") on loopback, each
    `ray start --block` in a process group of its own."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="tgray", dir="/tmp")  # short: socket paths
        self.env = {**os.environ, "RAY_TMPDIR": self.tmp}
        self.env.pop("RAY_ADDRESS", None)
        self.port = _free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.ray = str(Path(sys.executable).with_name("ray"))
        self.head = self._node("head", "--head", f"--port={self.port}", '--resources={"a": 4}')
        self.b: subprocess.Popen | None = None

    def _node(self, name: str, *arguments: str) -> subprocess.Popen:
        command = [
            self.ray, "start", *arguments, "--num-cpus=2", f"--node-ip-address={LOOPBACK}",
            "--include-dashboard=false", "--disable-usage-stats", "--block",
            f"--temp-dir={self.tmp}",
        ]  # fmt: skip
        if "--head" not in arguments:
            command.remove("--include-dashboard=false")
        with open(os.path.join(self.tmp, f"{name}.log"), "ab") as log:
            return subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start_b(self) -> None:
        """Start the second node and wait until Ray schedules on it."""
        alive = len(self.alive_nodes())
        self.b = self._node("b", f"--address={self.address}", '--resources={"b": 4}')
        _wait(lambda: len(self.alive_nodes()) > alive, 90, "the second node did not join")

    def alive_nodes(self) -> list[dict]:
        return [node for node in ray.nodes() if node["Alive"]]

    def node_with(self, resource: str) -> dict:
        (node,) = [n for n in self.alive_nodes() if resource in n["Resources"]]
        return node

    def kill_b(self) -> None:
        assert self.b is not None
        _kill(_descendants([self.b.pid]))
        self.b.wait()
        self.b = None

    def stop(self) -> None:
        roots = [p.pid for p in (self.head, self.b) if p is not None]
        killed = _descendants(roots)
        _kill(killed)
        for process in (self.head, self.b):
            if process is not None:
                process.wait()
        _kill(_ours(self.tmp))  # orphans of a killed node
        _wait(lambda: not _ours(self.tmp), 10, "Ray processes outlived the cluster")
        with contextlib.suppress(AssertionError):  # init reaps the orphans' zombies
            _wait(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in killed), 5, "")
        shutil.rmtree(self.tmp, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def _wait(condition, seconds: float, why: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(why)
        time.sleep(0.2)


def kill_actor(actor, seconds: float = 30) -> None:
    """Kill an actor and return once it is gone: `ray.kill` only asks, so a call sent at once
    can still run on the old actor (this raced in CI)."""
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + seconds
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return
        if time.monotonic() > deadline:
            raise AssertionError("the killed actor still answers")
        time.sleep(0.1)


def _connect(address: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            ray.init(address=address, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        pytest.skip("Ray is initialised in this process already")
    started = Cluster()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAY_TMPDIR", started.tmp)
            _connect(started.address)
            started.start_b()
            yield started
    finally:
        ray.shutdown()
        started.stop()


@pytest.fixture
def node_b(cluster):
    """The node with resource "b" (restarted when a test killed it)."""
    if cluster.b is None or cluster.b.poll() is not None:
        cluster.start_b()
    return cluster.node_with("b")


def ended(env, call: toolgym.ToolCall) -> tuple[str, str]:
    """Step one call that the sandbox cannot finish: the Stepper never raises for it, it ends
    the episode with a status (`env_error` for the infrastructure's failures, `tool_crash` /
    `tool_timeout` for what the model's call caused) and says why."""
    result = env.step(call)
    assert result.terminated and result.results[0].failure == result.info["ended"], result
    return result.info["ended"], result.info["error"]


def run(env, code: str) -> str:
    result = env.step(toolgym.ToolCall("run", {"code": code}))
    assert result.results[0].failure is None, result.messages
    return result.messages[0]["content"]


def test_an_environment_runs_on_the_chosen_node(cluster, node_b):
    env = toolgym.make("PythonREPL-v0", sandbox=RayBackend(resources={"b": 1}))
    try:
        assert env.reset(seed=0, task="add") == "add"
        assert "value: 42" in run(env, "6*7")
        isolation = env.isolation
        assert isinstance(isolation, RayIsolation)
        assert isolation.backend == "ray" and isolation.inner == "process"
        assert isolation.node_id == node_b["NodeID"] != cluster.node_with("a")["NodeID"]
        assert isolation.network is False and isolation.limits["processes"] == 0
        assert any(node_b["NodeID"] in note for note in isolation.notes)
        env.final_answer("nope")
        assert env.reward == 0.0 and not env.done
    finally:
        env.close()
    assert not list_sandbox_actors()


def test_the_sandbox_shorthand_and_the_head_node(cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    env = toolgym.make("Wordle-v0", sandbox="ray")
    try:
        env.reset(seed=0, answer="crane")
        assert env.step(toolgym.ToolCall("guess", {"word": "trace"})).results[0].failure is None
        assert env.isolation.backend == "ray"
    finally:
        env.close()
    placed = sandboxed(PythonREPL, {}, RayBackend(resources={"a": 1}))
    try:
        placed.reset(seed=0)
        assert placed.isolation.node_id == cluster.node_with("a")["NodeID"]
    finally:
        placed.close()
    plain = toolgym.make("Wordle-v0", sandbox=RayBackend(inner="local"))
    try:  # a worker subprocess with the process backend's limits, without bubblewrap
        plain.reset(seed=0, answer="crane")
        assert plain.isolation.inner == "process" and plain.isolation.filesystem == "host"
    finally:
        plain.close()
    # the model's code never runs there (it ran as root with only a warning): refused, naming
    # the option that allows it
    with pytest.raises(SandboxError, match=r"without bubblewrap.*allow_unsandboxed=True"):
        sandboxed(PythonREPL, {}, RayBackend(inner="local"))
    assert not list_sandbox_actors()


def test_calls_are_checked_on_the_host(cluster, node_b):
    env = sandboxed(PythonREPL, {}, RayBackend(resources={"b": 1}))
    try:
        env.reset(seed=0)
        channel = env.executor.channel
        sent = []
        original = channel._call
        channel._call = lambda method, *args: (sent.append(method), original(method, *args))[1]
        bad = env.step(toolgym.ToolCall("run", {"cod": "1"}))
        assert bad.results[0].failure == "invalid_arguments"
        assert sent == []  # never reached the actor
        assert "value: 2" in run(env, "1 + 1")
        assert sent == ["exchange"]  # one actor call per request
    finally:
        env.close()


def test_a_killed_actor_ends_the_call_and_reset_starts_a_fresh_one(cluster, node_b):
    env = sandboxed(PythonREPL, {}, RayBackend(resources={"b": 1}), call_timeout=20)
    try:
        env.reset(seed=0)
        assert "value: 42" in run(env, "6*7")
        kill_actor(env.executor.channel.actor)
        started = time.monotonic()
        status, why = ended(env, toolgym.ToolCall("run", {"code": "1"}))
        assert status == "env_error", why  # the infrastructure's, left out of the loss
        assert time.monotonic() - started < 3.0
        assert not env.alive
        restarts = env.restarts
        env.reset(seed=1)
        assert env.restarts == restarts + 1 and env.alive
        assert "value: 42" in run(env, "6*7")
    finally:
        env.close()


def test_a_killed_actor_mid_call_ends_it_at_once(cluster, node_b):
    env = sandboxed(PythonREPL, {}, RayBackend(resources={"b": 1}), call_timeout=20)
    try:
        env.reset(seed=0)
        actor = env.executor.channel.actor
        threading.Timer(1.0, lambda: ray.kill(actor, no_restart=True)).start()
        started = time.monotonic()
        status, why = ended(env, toolgym.ToolCall("run", {"code": "import time; time.sleep(15)"}))
        assert status == "env_error" and "the sandbox's Ray actor is gone" in why, why
        assert time.monotonic() - started < 5.0
    finally:
        env.close()


def _with_test_envs(**options) -> RayBackend:
    """A backend whose actors import `tests/sandbox_envs.py` (Ray's runtime environment)."""
    tests = str(Path(__file__).resolve().parents[1])
    return RayBackend(runtime_env={"env_vars": {"PYTHONPATH": tests}}, **options)


def _until_ended(env, call: toolgym.ToolCall, tries: int = 3) -> list[str]:
    """Each reply's text until a step ends the episode, then the status and why."""
    outcomes = []
    for _ in range(tries):
        result = env.step(call)
        if result.info["ended"]:
            outcomes.append(f"{result.info['ended']}: {result.info['error']}")
            break
        outcomes.append(result.messages[0]["content"])
    return outcomes


def test_forged_replies_are_caught_on_the_host(cluster, node_b):
    from sandbox_envs import Forger

    env = sandboxed(Forger, {}, _with_test_envs(resources={"b": 1}))
    try:
        env.reset()
        # replies for requests not yet asked: the worker broke the protocol during the call
        outcomes = _until_ended(env, toolgym.ToolCall("forge", {"first_id": 100, "count": 5}))
        assert outcomes[-1].startswith("tool_crash: ") and "broke the protocol" in outcomes[-1]
        env.reset()
        assert env.get_reward() == 0.0
        # a reply for the request being asked: at most one is believed
        outcomes = _until_ended(env, toolgym.ToolCall("forge", {"first_id": 1, "count": 300}))
        assert any("broke the protocol" in outcome for outcome in outcomes), outcomes
        assert outcomes.count("forged") <= 1
        env.reset()
        assert env.get_reward() == 0.0
    finally:
        env.close()


def test_a_hung_tool_times_out_within_its_own_timeout(cluster, node_b):
    from sandbox_envs import Misbehaving

    env = sandboxed(Misbehaving, {}, _with_test_envs(resources={"b": 1}), call_timeout=2.0)
    try:
        env.reset(seed=0)
        started = time.monotonic()
        status, why = ended(env, toolgym.ToolCall("loop_forever", {}))
        assert status == "tool_timeout", why  # the model's call ran out of time
        assert time.monotonic() - started < 3.5  # the actor enforces it, not Ray's margin
        env.reset(seed=0)
        assert env.step(toolgym.ToolCall("echo", {"text": "hi"})).messages[0]["content"] == "hi"
    finally:
        env.close()


def test_a_snapshot_forks_into_new_actors_and_moves_to_another_node(cluster, node_b):
    """Issue 46 item 2 on Ray: a fork is a new actor (its own inner sandbox), and a snapshot
    taken on one node restores into an environment on another (the worker's pickle travels
    opaque through the host)."""
    from sandbox_envs import Keeper

    small = {"num_cpus": 0.5}  # three actors on a node of two CPUs
    on_b = sandboxed(Keeper, {}, _with_test_envs(resources={"b": 1, **small}))
    on_a = sandboxed(Keeper, {}, _with_test_envs(resources={"a": 1, **small}))
    copies = []
    try:
        on_b.reset(seed=0)
        on_a.reset(seed=0)
        assert on_b.step(toolgym.ToolCall("keep", {"text": "x"})).messages[0]["content"] == "1"
        snapshot = on_b.snapshot()
        copies = on_b.fork(2)
        actors = {e.isolation.actor for e in (on_b, *copies)}
        assert len(actors) == 3 and all(
            e.isolation.node_id == on_b.isolation.node_id for e in copies
        )
        for copy in copies:
            assert copy.step(toolgym.ToolCall("keep", {"text": "y"})).messages[0]["content"] == "2"
        assert on_a.isolation.node_id != on_b.isolation.node_id
        on_a.restore(snapshot)
        assert on_a.step(toolgym.ToolCall("keep", {"text": "z"})).messages[0]["content"] == "2"
        assert on_b.step(toolgym.ToolCall("keep", {"text": "w"})).messages[0]["content"] == "2"
    finally:
        for env in (on_b, on_a, *copies):
            env.close()


def test_a_snapshot_longer_than_one_relayed_reply_forks_and_moves_through_ray(cluster, node_b):
    """A REPL holding 24 MiB of model-built state (its snapshot a line of over 32 MiB, more
    than the actor relays in one reply) forks into a new actor and restores on the other
    node, whole."""
    small = {"num_cpus": 0.5}
    source = sandboxed(PythonREPL, {}, RayBackend(resources={"b": 1, **small}), call_timeout=60)
    target = sandboxed(PythonREPL, {}, RayBackend(resources={"a": 1, **small}), call_timeout=60)
    copies = []
    try:
        source.reset(seed=0)
        target.reset(seed=0)
        run(source, "blob = bytes(range(256)) * (96 << 10)")
        snapshot = source.snapshot()
        assert len(pickle.dumps(snapshot)) > 24 << 20
        copies = source.fork(1)
        target.restore(snapshot)
        for env in (*copies, target):
            assert "value: (25165824, 232)" in run(env, "len(blob), blob[1000]")
        assert target.isolation.node_id != source.isolation.node_id
    finally:
        for env in (source, target, *copies):
            env.close()


def test_a_killed_node_ends_the_call_not_a_hang(cluster, node_b):
    env = sandboxed(PythonREPL, {}, RayBackend(resources={"b": 1}), call_timeout=10)
    try:
        env.reset(seed=0)
        assert "value: 42" in run(env, "6*7")
        threading.Timer(1.0, cluster.kill_b).start()
        started = time.monotonic()
        status, why = ended(env, toolgym.ToolCall("run", {"code": "import time; time.sleep(8)"}))
        took = time.monotonic() - started
        print(f"node killed: {why} after {took:.1f} s")
        assert status == "env_error", why  # a lost node: the infrastructure's
        assert took < 10 + 5 + 2, took  # the call's timeout and Ray's margin at most
        assert not env.alive
        with pytest.raises(SandboxError):  # the next episode cannot start on a dead node
            env.reset(seed=1)
    finally:
        env.close()


def test_a_sandbox_that_cannot_start_names_why_and_leaves_no_actor(cluster):
    started = time.monotonic()
    nowhere = RayBackend(resources={"gpu-node": 1}, start_timeout=3)
    with pytest.raises(SandboxError, match="no Ray node hosted a sandbox within 3 s"):
        sandboxed(PythonREPL, {}, nowhere)
    assert time.monotonic() - started < 10
    with pytest.raises(SandboxError, match=r"could not start on its Ray node.*unknown inner"):
        sandboxed(PythonREPL, {}, RayBackend(inner="firecracker"))
    _wait(lambda: not list_sandbox_actors(), 30, f"actors left: {list_sandbox_actors()}")


def test_no_actor_is_left(cluster):
    env = sandboxed(PythonREPL, {}, RayBackend(resources={"a": 1}))
    env.reset(seed=0)
    name = env.isolation.actor
    assert name in list_sandbox_actors()
    env.close()
    assert name not in list_sandbox_actors()
    _wait(lambda: not list_sandbox_actors(), 60, f"actors left: {list_sandbox_actors()}")
