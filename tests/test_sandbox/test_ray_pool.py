"""Warm pools across a real two-node Ray cluster started on this machine (see
`test_ray_backend.py`'s `Cluster`): a spread pool keeps instances on both nodes, a node killed
mid-episode ends that episode with `env_error` and the next lease is a healthy instance on a
live node, a pool that cannot start anywhere says why from `lease()`, a GRPO step plays with
environments on both nodes (`GRPOConfig(sandbox="ray")`), and neither a closed pool nor a
driver that exits leaves an actor or a process behind.
Skips as `test_ray_backend.py` does (no Ray, no bubblewrap) unless TOOLGYM_REQUIRE_SANDBOXES=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import test_ray_backend
from helpers import ids
from test_ray_backend import _descendants, _wait, kill_actor, run

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.builtin_envs.wordle import Wordle
from toolgym.sandbox import SandboxPool
from toolgym.sandbox.ray_backend import RayBackend, list_sandbox_actors
from toolgym.sandbox.remote import SandboxError
from toolgym.testing import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.slow
ray = test_ray_backend.ray
cluster = test_ray_backend.cluster  # the fixtures: a cluster of this module's own
node_b = test_ray_backend.node_b


def _gone(pids: list[int]) -> bool:
    """No process of `pids` is left (a zombie waiting for init to reap it counts as gone)."""
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return False
    return True


def _processes(envs) -> list[int]:
    """Each instance's actor process and everything below it (the inner sandbox)."""
    return _descendants([env.executor.channel.actor_pid for env in envs])


def _nothing_left(pids: list[int]) -> None:
    _wait(lambda: not list_sandbox_actors(), 60, f"actors left: {list_sandbox_actors()}")
    _wait(lambda: _gone(pids), 30, f"processes left: {[p for p in pids if not _gone([p])]}")


def test_a_spread_pool_keeps_instances_warm_on_both_nodes(cluster, node_b):
    head = cluster.node_with("a")["NodeID"]
    with SandboxPool(Wordle, backend=RayBackend(spread=True), size=4) as pool:
        pool.wait_ready(timeout=120)
        assert pool.placement() == {head: 2, node_b["NodeID"]: 2}
        leased = [pool.lease(timeout=30) for _ in range(4)]
        assert {env.isolation.node_id for env in leased} == {head, node_b["NodeID"]}
        pids = _processes(leased)
        for env in leased:
            env.reset(seed=0, answer="crane")
            result = env.step(toolgym.ToolCall("guess", {"word": "crane"}))
            assert result.results[0].failure is None and env.reward == 1.0
            env.close()  # back to the pool: Wordle runs no model code, reused
        assert pool.idle == 4 and pool.stats["replaced"] == 0
        again = pool.lease(timeout=30)
        assert again in leased and again.alive
        again.close()
    _nothing_left(pids)


def _sleeping_episode(tokenizer, env, seconds: float):
    code = f"import time; time.sleep({seconds})"
    reply = (
        '<tool_call>\n{"name": "run", "arguments": {"code": "' + code + '"}}\n</tool_call>'
        "<|im_end|>"
    )
    engine = ScriptedEngine([ids(tokenizer, reply)])
    agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(max_turns=2))
    prompt = {"prompt": [{"role": "user", "content": "go"}], "task": "sleep", "answer": "x"}
    (trajectory,) = agent.run([env], [prompt])
    return trajectory


def test_a_node_killed_mid_episode_ends_it_and_the_next_lease_is_on_a_live_node(cluster, node_b):
    head, b = cluster.node_with("a")["NodeID"], node_b["NodeID"]
    pool = SandboxPool(
        PythonREPL, backend=RayBackend(spread=True), size=2, call_timeout=20, start_threads=2
    )
    try:
        pool.wait_ready(timeout=120)
        first, second = pool.lease(timeout=30), pool.lease(timeout=30)
        on_b, on_head = (first, second) if first.isolation.node_id == b else (second, first)
        assert (on_b.isolation.node_id, on_head.isolation.node_id) == (b, head)
        pids = _processes([on_b, on_head])
        threading.Timer(2.0, cluster.kill_b).start()
        started = time.monotonic()
        trajectory = _sleeping_episode(tiny_tokenizer(), on_b, 12)
        took = time.monotonic() - started
        print(
            f"node killed mid-episode: {trajectory.status} after {took:.1f} s: {trajectory.error}"
        )
        assert trajectory.status == "env_error" and trajectory.failed, trajectory.error
        assert "Ray actor is gone" in trajectory.error or "did not answer" in trajectory.error
        assert took < 20 + 5 + 5, took  # the call's timeout and Ray's margin at most
        on_b.close()  # dead: retired, and a fresh instance starts on a live node
        fresh = pool.lease(timeout=120)
        assert fresh.alive and fresh.isolation.node_id == head
        fresh.reset(task="add", answer="42")
        assert "value: 42" in run(fresh, "6*7")
        assert pool.stats["replaced"] >= 1
        pids += _processes([fresh])
        fresh.close()
        on_head.close()
    finally:
        pool.close()
    _nothing_left(pids)


@pytest.mark.parametrize("per_actor", [1, 4])
def test_a_pool_that_cannot_start_anywhere_says_why_from_lease(cluster, per_actor):
    nowhere = RayBackend(resources={"gpu-node": 1}, start_timeout=2, per_actor=per_actor)
    started = time.monotonic()
    pool = SandboxPool(Wordle, backend=nowhere, size=2, max_start_failures=2)
    with pool, pytest.raises(SandboxError, match="no Ray node hosted a sandbox within 2 s"):
        pool.lease(timeout=60)
    assert time.monotonic() - started < 20
    _wait(lambda: not list_sandbox_actors(), 30, f"actors left: {list_sandbox_actors()}")


def test_bad_resources_are_named(cluster):
    from toolgym.algorithms import GRPOConfig

    with pytest.raises(ValueError, match="num_cpus=-1"):
        RayBackend(resources={"num_cpus": -1})
    with pytest.raises(ValueError, match="unknown sandbox 'rai'"):
        GRPOConfig(sandbox="rai")
    with pytest.raises(ValueError, match='sandbox_resources only apply with sandbox="ray"'):
        GRPOConfig(sandbox="process", sandbox_resources={"envhost": 1})


def test_a_grpo_step_plays_with_environments_on_both_nodes(cluster, node_b, tmp_path):
    from toolgym.algorithms import GRPOConfig, GRPOTrainer

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        prompts_per_step=1,
        num_generations=4,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=2, max_new_tokens=16, max_episode_tokens=300),
        parser="hermes",
        progress_bar=False,
        save_steps=0,
        sandbox="ray",
        sandbox_resources={"num_cpus": 0.5},
    )
    rows = list(toolgym.spec("Wordle-v0").dataset(2, seed=0))
    trainer = GRPOTrainer(tiny_model(tokenizer), "Wordle-v0", rows, args=args, tokenizer=tokenizer)
    try:
        trainer.env_pool.wait_ready(timeout=120)
        nodes = {cluster.node_with("a")["NodeID"], node_b["NodeID"]}
        assert trainer.env_pool.placement() == dict.fromkeys(nodes, 2)
        played, lease = [], trainer.make_env
        trainer.make_env = lambda row, seed: played.append(lease(row, seed)) or played[-1]
        history = trainer.train()
        assert len(history) == 2 and len(played) == 8
        assert {env.isolation.node_id for env in played} == nodes
        assert all(h["statuses"].get("env_error", 0) == 0 for h in history), history
        assert trainer.env_pool.stats["started"] == 4  # warm: reused across the steps
        pids = _processes(played[:4])
    finally:
        trainer.close()
        trainer.close()  # twice is fine
    _nothing_left(pids)


DRIVER = """
import os, sys, ray
from toolgym.builtin_envs.wordle import Wordle
from toolgym.sandbox import SandboxPool
from toolgym.sandbox.ray_backend import RayBackend
ray.init(address=sys.argv[1], log_to_driver=False)
pool = SandboxPool(Wordle, backend=RayBackend(spread=True), size=2)
pool.wait_ready(timeout=120)
envs = [pool.lease() for _ in range(2)]
print(" ".join(str(env.executor.channel.actor_pid) for env in envs), flush=True)
os._exit(0)  # no close(): Ray ends the actors of a driver that is gone
"""


def test_a_driver_that_exits_without_closing_leaves_no_actor(cluster, node_b):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRIVER), cluster.address],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAY_TMPDIR": cluster.tmp},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    actors = [int(pid) for pid in done.stdout.split()]
    assert len(actors) == 2
    _nothing_left(_descendants(actors))


def test_toolgym_train_with_sandbox_ray(cluster, node_b, tmp_path, monkeypatch):
    from toolgym.cli import main
    from toolgym.sandbox import ray_backend

    tokenizer = tiny_tokenizer()
    model = tmp_path / "model"
    tiny_model(tokenizer).save_pretrained(model)
    tokenizer.save_pretrained(model)
    placed, start = [], ray_backend.RayBackend.start

    def spy(backend, target=None):
        channel = start(backend, target)
        placed.append((backend.spread, backend.resources, channel.node_id))
        return channel

    monkeypatch.setattr(ray_backend.RayBackend, "start", spy)
    argv = ["train", "Wordle-v0", "--model", str(model), "--engine", "hf"]
    argv += ["--max-steps", "1", "--prompts-per-step", "1", "--num-generations", "2"]
    argv += ["--micro-batch-size", "2", "--max-turns", "1", "--max-new-tokens", "8"]
    argv += ["--parser", "hermes", "--output-dir", str(tmp_path / "run"), "--no-progress-bar"]
    argv += ["--save-steps", "0", "--sandbox", "ray", "--sandbox-resources", '{"num_cpus": 0.5}']
    assert main(argv) == 0
    assert len(placed) == 2 and all(spread for spread, _, _ in placed)
    assert all(resources == {"num_cpus": 0.5} for _, resources, _ in placed)
    assert {node for _, _, node in placed} == {cluster.node_with("a")["NodeID"], node_b["NodeID"]}
    _wait(lambda: not list_sandbox_actors(), 60, f"actors left: {list_sandbox_actors()}")


def test_shared_actors_host_several_instances_each(cluster, node_b):
    """`per_actor`: thousands of light instances need fewer Ray workers; an instance killed
    alone leaves its actor's other instances working; the actor goes with its last one."""
    backend = RayBackend(per_actor=3, inner="inline", spread=True, resources={"num_cpus": 0.5})
    with SandboxPool(Wordle, backend=backend, size=6, start_threads=6) as pool:
        pool.wait_ready(timeout=120)
        assert len(list_sandbox_actors()) == 2
        envs = [pool.lease(timeout=30) for _ in range(6)]
        assert {env.isolation.inner for env in envs} == {"inline"}
        assert len({env.isolation.node_id for env in envs}) == 2  # the two actors, spread
        by_actor: dict[str, list] = {}
        for env in envs:
            by_actor.setdefault(env.isolation.actor, []).append(env)
        (victim, *neighbours), _ = by_actor.values()
        victim.executor.channel.kill()
        assert not victim.alive
        for env in neighbours:
            env.reset(seed=0, answer="crane")
            assert env.step(toolgym.ToolCall("guess", {"word": "crane"})).results[0].ok
            assert env.reward == 1.0
        for env in envs:
            env.close()
    _wait(lambda: not list_sandbox_actors(), 60, f"actors left: {list_sandbox_actors()}")


def test_a_lost_shared_actor_fails_its_instances_and_the_pool_starts_a_new_one(cluster, node_b):
    backend = RayBackend(per_actor=2, inner="inline", resources={"num_cpus": 0.5})
    with SandboxPool(Wordle, backend=backend, size=2, start_threads=2) as pool:
        pool.wait_ready(timeout=120)
        first, second = pool.lease(timeout=30), pool.lease(timeout=30)
        lost = first.isolation.actor
        assert second.isolation.actor == lost  # one actor hosts both
        for env in (first, second):
            env.reset(seed=0, answer="crane")
        kill_actor(first.executor.channel.actor)
        for env in (first, second):
            result = env.step(toolgym.ToolCall("guess", {"word": "crane"}))
            assert result.info["ended"] == "env_error", result.info
            env.close()  # dead: retired
        fresh = pool.lease(timeout=60)
        assert fresh.isolation.actor != lost
        fresh.reset(seed=0, answer="crane")
        assert fresh.step(toolgym.ToolCall("guess", {"word": "crane"})).results[0].ok
        fresh.close()
    _wait(lambda: not list_sandbox_actors(), 60, f"actors left: {list_sandbox_actors()}")


def test_inline_instances_time_out_and_refuse_model_code(cluster):
    from sandbox_envs import Misbehaving

    tests = str(Path(__file__).resolve().parents[1])
    inline = RayBackend(inner="inline", runtime_env={"env_vars": {"PYTHONPATH": tests}})
    with pytest.raises(SandboxError, match="inner='inline' hosts no model code"):
        toolgym.sandbox.sandboxed(PythonREPL, {}, inline)
    env = toolgym.sandbox.sandboxed(Misbehaving, {}, inline, call_timeout=1.0)
    try:
        env.reset(seed=0)
        assert env.step(toolgym.ToolCall("echo", {"text": "hi"})).messages[0]["content"] == "hi"
        started = time.monotonic()
        result = env.step(toolgym.ToolCall("loop_forever", {}))
        assert result.info["ended"] == "tool_timeout", result.info
        assert time.monotonic() - started < 3.0
    finally:
        env.close()
    _wait(lambda: not list_sandbox_actors(), 30, f"actors left: {list_sandbox_actors()}")
