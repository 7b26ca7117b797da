"""Sandboxes: the same environment surface in a subprocess and in a container, and every
misbehaviour ending in a named status while the run goes on and nothing is left behind.

The process tests that need bubblewrap, and the docker tests, skip with the reason when the
machine lacks it, unless TOOLGYM_REQUIRE_SANDBOXES=1 (CI sets it): then they run and fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import ids
from sandbox_envs import Misbehaving
from sandbox_marks import needs_bwrap, needs_docker

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.sandbox import SandboxPool, sandboxed
from toolgym.sandbox.process import ProcessBackend, ProcessLimits
from toolgym.sandbox.remote import RemoteEnvironment, RemoteError, SandboxError
from toolgym.testing import tiny_tokenizer

BACKENDS = [
    pytest.param("process", id="process"),
    pytest.param("docker", id="docker", marks=[needs_docker, pytest.mark.docker]),
]


def call(env, name: str, **arguments):
    return env.step(toolgym.ToolCall(name, arguments))


@pytest.fixture(params=BACKENDS)
def misbehaving(request):
    backend = (
        ProcessBackend(limits=ProcessLimits(memory_bytes=1 << 30))
        if request.param == "process"
        else request.param
    )
    env = sandboxed(Misbehaving, {}, backend, call_timeout=3.0)
    env.reset(seed=0)
    yield env
    env.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_a_sandboxed_environment_behaves_like_the_local_one(where):
    local = toolgym.make("PythonREPL-v0", sandbox="local")
    remote = toolgym.make("PythonREPL-v0", sandbox=where)
    try:
        assert remote.tools == local.tools
        assert remote.reset(seed=0, task="add") == local.reset(seed=0, task="add") == "add"
        for env in (local, remote):
            call(env, "run", code="x = 20")
        answers = [call(env, "run", code="print('hi'); x + 22").messages for env in (local, remote)]
        assert answers[0] == answers[1]
        assert "hi" in answers[1][0]["content"] and "value: 42" in answers[1][0]["content"]
        bad = call(remote, "run", cod="1")  # checked on the host, like locally
        assert bad.results[0].failure == "invalid_arguments"
        remote.final_answer("nope")
        assert remote.reward == 0.0 and not remote.done  # no answer was set: no grading
        assert remote.isolation.network is False
    finally:
        remote.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_episode_metrics_cross_the_sandbox(where):
    remote = toolgym.make("Wordle-v0", sandbox=where)
    try:
        remote.reset(seed=0, answer="crane")
        call(remote, "guess", word="trace")
        assert remote.episode_metrics() == {
            "valid_guesses": 1.0,
            "distinct_words": 1.0,
            "consistent_guesses": 0.0,
            "greens_found": 3.0,
            "yellows_found": 1.0,
            "win": 0.0,
        }
    finally:
        remote.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_misbehaving_tools_end_in_named_statuses_and_the_next_episode_runs(where):
    """Through the agent: an endless loop is `tool_timeout` and a worker the call ended
    `tool_crash` (both the model's outcome), a raising reset `env_error` (the
    environment's); each sandbox is replaced and a normal episode follows."""
    tokenizer = tiny_tokenizer()

    def reply(name: str) -> str:
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n</tool_call><|im_end|>'

    env = sandboxed(Misbehaving, {}, where, call_timeout=2.0)
    statuses = []
    try:
        for tool, row in (("loop_forever", {}), ("exit_now", {}), ("echo", {"fail": True})):
            engine = ScriptedEngine([ids(tokenizer, reply(tool))])
            agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(max_turns=1))
            prompt = {"prompt": [{"role": "user", "content": "go"}], **row}
            (trajectory,) = agent.run([env], [prompt])
            statuses.append((trajectory.status, trajectory.error))
        assert [s for s, _ in statuses] == ["tool_timeout", "tool_crash", "env_error"]
        assert "exit code 1" in statuses[1][1]
        assert "reset failed on purpose" in statuses[2][1]
        assert (
            env.reset(seed=1) == "ready"
            and call(env, "echo", text="ok").messages[0]["content"] == "ok"
        )
        assert env.restarts >= 2  # the looping worker and the dead one were replaced
    finally:
        env.close()


def test_a_huge_allocation_fails_inside_the_sandbox(misbehaving):
    """On both backends an allocation past the limit is a MemoryError the model reads (the
    address-space limit fires before docker's OOM killer), and the worker lives on."""
    step = call(misbehaving, "allocate", gigabytes=10)
    assert step.results[0].failure == "tool_exception"
    assert "MemoryError" in step.messages[0]["content"]
    assert call(misbehaving, "echo", text="same worker").messages[0]["content"] == "same worker"
    misbehaving.reset(seed=1)
    assert call(misbehaving, "echo", text="alive").messages[0]["content"] == "alive"


def test_a_fork_bomb_is_stopped(misbehaving):
    started = time.perf_counter()
    content = call(misbehaving, "fork_bomb").messages[0]["content"]
    assert content.startswith("stopped after"), content
    assert int(content.split()[2]) <= 64
    assert time.perf_counter() - started < 10


@needs_bwrap
@pytest.mark.parametrize("where", BACKENDS)
def test_no_writes_outside_its_tmp_and_no_network(where):
    env = sandboxed(Misbehaving, {}, where, call_timeout=10.0)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    try:
        env.reset(seed=0)
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the host can
        for outside in (
            Path(__file__).parent / f"escaped-{os.getpid()}.txt",  # beside the project's files
            Path("/var/tmp") / f"escaped-{os.getpid()}.txt",  # a host folder outside /tmp
        ):
            written = call(env, "write_file", path=str(outside))
            assert not outside.exists()  # never on the host
            if str(outside).startswith("/tmp/"):  # a checkout under /tmp: its private /tmp
                continue
            assert written.results[0].failure == "tool_exception"
            content = written.messages[0]["content"]  # read-only, not mounted, or nobody's
            refusals = ("Read-only file system", "No such file", "Permission denied")
            assert any(refusal in content for refusal in refusals), content
        assert call(env, "write_file", path="/tmp/inside.txt").messages[0]["content"] == "written"
        for host in ("127.0.0.1", "192.0.2.1"):
            result = call(env, "connect", host=host, port=port if host == "127.0.0.1" else 80)
            assert result.results[0].failure == "tool_exception", result.messages
            assert (
                "refused" in result.messages[0]["content"]
                or "unreachable" in (result.messages[0]["content"])
            )
        assert env.isolation.network is False
    finally:
        server.close()
        env.close()


def test_megabytes_of_output_and_unserialisable_results(misbehaving):
    assert call(misbehaving, "shout", megabytes=8).messages[0]["content"] == "still here"
    local = toolgym.as_environment(Misbehaving())
    local.reset(seed=0)
    for tool, arguments in (("unserialisable", {}), ("describe", {"word": "café"})):
        assert (
            call(misbehaving, tool, **arguments).results == call(local, tool, **arguments).results
        )
    bad = call(misbehaving, "unserialisable")
    assert (
        bad.results[0].failure == "bad_result"
        and "is not JSON and cannot be shown as text" in (bad.messages[0]["content"])
    )
    repl = toolgym.make("PythonREPL-v0", sandbox=misbehaving.backend)
    try:
        repl.reset(seed=0)
        content = call(repl, "run", code="print('y' * 5_000_000)").messages[0]["content"]
        assert len(content) < 5000 and "more characters cut" in content
    finally:
        repl.close()


def test_a_raising_reset_is_a_remote_error_with_the_cause(misbehaving):
    with pytest.raises(RemoteError, match="reset failed on purpose"):
        misbehaving.reset(seed=0, fail=True)
    assert misbehaving.reset(seed=0) == "ready"


def test_process_isolation_says_what_it_got():
    env = sandboxed(Misbehaving, {}, "process")
    try:
        isolation = env.isolation
        assert isolation.limits["memory_bytes"] == ProcessLimits().memory_bytes
        assert isolation.limits.get("processes") == 0  # seccomp: no new processes
        if shutil.which("bwrap"):
            assert (isolation.network, isolation.filesystem) == (False, "minimal read-only view")
            assert "no capabilities" in isolation.user
        else:
            assert any("bubblewrap" in note for note in isolation.notes)
    finally:
        env.close()


def test_pool_leases_reuses_and_replaces():
    with SandboxPool(Misbehaving, backend="process", size=2, max_lease_seconds=2.0) as pool:
        pool.wait_ready(timeout=60)
        first = pool.lease()
        first.reset(seed=0)
        first.close()
        again = pool.lease()
        assert again is first  # reused through reset
        again.reset(seed=1)
        time.sleep(3.0)  # the lease outlives its maximum: worker killed, not the model's doing
        late = call(again, "echo", text="late")
        assert late.info["ended"] == "env_error", late.info
        assert "max_lease_seconds" in late.info["error"]
        again.close()
        assert pool.stats["expired"] == 1
        pool.wait_ready(timeout=60)
        fresh = pool.lease()
        assert fresh is not first and fresh.reset(seed=2) == "ready"
        fresh.close()


def test_a_pool_whose_workers_all_died_starts_new_ones():
    with SandboxPool(Misbehaving, backend="process", size=2) as pool:
        pool.wait_ready(timeout=60)
        dead = [pool.lease() for _ in range(2)]
        for env in dead:
            env.close()
        for env in dead:  # both idle again; now every worker dies
            env.executor.channel.kill()
        fresh = pool.lease(timeout=60)
        assert fresh not in dead and fresh.reset(seed=0) == "ready"
        assert pool.stats["replaced"] >= 2
        fresh.close()


def test_a_pool_that_cannot_start_anything_raises_the_cause():
    from test_sandbox_privileges import WritableImportPath

    backend = WritableImportPath()
    started = time.monotonic()
    with SandboxPool(Misbehaving, backend=backend, size=2, max_start_failures=3) as pool:
        cause = r"(?s)no sandbox of Misbehaving could start .* /tmp/no-sandbox-today is missing"
        with pytest.raises(SandboxError, match=cause):
            pool.lease()
        with pytest.raises(SandboxError, match="refused to start"):
            pool.wait_ready(timeout=60)
        assert pool.stats["start_failures"] >= 3
    assert time.monotonic() - started < 30


@needs_docker
@pytest.mark.docker
def test_killing_the_parent_leaves_no_container_after_the_next_start(tmp_path):
    import docker

    from toolgym.sandbox.docker import LABEL, OWNER_LABEL, reap_orphans

    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            from toolgym.builtin_envs.python_repl import PythonREPL
            from toolgym.sandbox import SandboxPool
            pool = SandboxPool(PythonREPL, backend="docker", size=8)
            pool.wait_ready(timeout=120)
            print("ready", flush=True)
            time.sleep(600)
            """
        )
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        client = docker.from_env()
        owned = client.containers.list(filters={"label": OWNER_LABEL}, ignore_removed=True)
        mine = [c for c in owned if c.labels[OWNER_LABEL].split(":")[3] == str(parent.pid)]
        assert len(mine) == 8
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    reap_orphans(force=True)  # what the next DockerBackend.start() does first

    def left() -> list:
        return [
            c
            for c in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
            if c.labels.get(OWNER_LABEL, "").split(":")[3:4] == [str(parent.pid)]
        ]

    deadline = time.monotonic() + 20  # removals the daemon has begun may take a moment
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left() == []


def test_the_trainer_plays_its_rollouts_in_sandboxes(tmp_path):
    from toolgym.algorithms import GRPOConfig, GRPOTrainer
    from toolgym.sandbox.remote import RemoteEnvironment
    from toolgym.testing import tiny_model

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        prompts_per_step=1,
        num_generations=2,
        micro_batch_size=2,
        limits=AgentLimits(max_turns=2, max_new_tokens=16, max_episode_tokens=300),
        parser="hermes",
        progress_bar=False,
        save_steps=0,
        sandbox="process",
    )
    rows = list(toolgym.spec("Wordle-v0").dataset(2, seed=0))
    trainer = GRPOTrainer(tiny_model(tokenizer), "Wordle-v0", rows, args=args, tokenizer=tokenizer)
    created, make = [], trainer.make_env
    trainer.make_env = lambda row, seed: created.append(make(row, seed)) or created[-1]
    (metrics,) = trainer.train()
    assert len(created) == 2 and all(isinstance(e, RemoteEnvironment) for e in created)
    assert "env_error" not in metrics["statuses"]
    assert not any(e.alive for e in created)  # closed after the step


@needs_docker
@pytest.mark.docker
def test_docker_shows_the_module_not_its_folder_and_names_a_missing_image():
    from sandbox_envs import Prober

    from toolgym.sandbox.docker import DockerBackend

    env = RemoteEnvironment(Prober, backend=DockerBackend())
    try:
        env.reset()
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
        visible = call(env, "exists", path="/opt/module/sandbox_envs.py").messages[0]["content"]
        assert visible == "true"  # the environment's module is mounted...
        for sibling in ("helpers.py", "conftest.py"):  # ...and nothing beside it
            for folder in ("/opt/module", "/opt/code/0", here):
                path = os.path.join(folder, sibling)
                assert call(env, "exists", path=path).messages[0]["content"] == "false", path
    finally:
        env.close()
    missing = DockerBackend(image="toolgym-no-such-image:none")
    with pytest.raises(SandboxError, match="does not exist here; build it"):
        RemoteEnvironment(Misbehaving, backend=missing).reset()


@pytest.mark.parametrize("where", ["local", *BACKENDS])
def test_nothing_the_model_sends_raises_out_of_step(where):
    """Arguments nested past the limit, too large, or not decodable are answered as invalid
    arguments, on every backend; text with lone surrogates round-trips."""
    env = sandboxed(Misbehaving, {}, where)
    try:
        env.reset()
        deep: object = "x"
        for _ in range(5000):
            deep = [deep]
        cases = {
            "nest deeper than 32": {"text": deep},
            "too large": {"text": "y" * (5 << 20)},
            "cannot be read": '{"text": ' + "[" * 3000 + "]" * 3000 + "}",
        }
        for reason, arguments in cases.items():
            result = env.step(toolgym.ToolCall("echo", arguments))
            assert result.results[0].failure == "invalid_arguments", result.messages
            assert reason in result.messages[0]["content"]
        # a lone surrogate comes back escaped: a tokenizer and a UTF-8 log take the text
        assert call(env, "echo", text="\udc80 odd").messages[0]["content"] == "\\udc80 odd"
        assert call(env, "echo", text="still fine").messages[0]["content"] == "still fine"
    finally:
        env.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_forged_replies_kill_the_worker_and_never_reach_the_next_episode(where):
    from sandbox_envs import Forger

    env = sandboxed(Forger, {}, where)
    try:
        env.reset()
        # replies for requests not yet asked: caught when the real reply is read; the model's
        # code did it, so the episode ends as the model's tool_crash
        for _ in range(3):
            forged = call(env, "forge", first_id=100, count=5)
            if forged.info["ended"]:
                break
        assert forged.info["ended"] == "tool_crash", forged.info
        assert "broke the protocol" in forged.info["error"]
        assert env.reset() is None  # a fresh worker: nothing forged survives
        assert env.get_reward() == 0.0
        assert call(env, "forge", first_id=10_000, count=0).messages[0]["content"] == "honest"
        # a reply for the request being asked: at best one forged answer, then the worker dies
        outcomes = []
        for _ in range(3):
            result = call(env, "forge", first_id=1, count=300)
            if result.info["ended"]:
                outcomes.append(f"{result.info['ended']}: {result.info['error']}")
                break
            outcomes.append(result.messages[0]["content"])
        assert any("broke the protocol" in outcome for outcome in outcomes), outcomes
        assert outcomes.count("forged") <= 1
        env.reset()
        assert env.get_reward() == 0.0
    finally:
        env.close()


def test_the_reaper_judges_only_owners_it_can_see():
    """Owner labels name host, boot, pid and start time: containers of another machine on a
    shared DOCKER_HOST are never reaped; here, a dead or reused pid or a reboot is."""
    from toolgym.sandbox.docker import _owner, owner_is_dead

    mine = _owner()
    host, boot, namespace, pid, started = mine.split(":")
    assert not owner_is_dead(mine)
    assert not owner_is_dead(f"another-machine:{boot}:{namespace}:{pid}:{started}")
    assert not owner_is_dead(f"{host}:{boot}:another-container:{pid}:{started}")
    assert not owner_is_dead("an-old-label:123")  # unknown formats are left alone
    assert owner_is_dead(f"{host}:an-earlier-boot:{namespace}:{pid}:{started}")
    assert owner_is_dead(f"{host}:{boot}:{namespace}:{pid}:{int(started) + 1}")  # pid reused
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert owner_is_dead(f"{host}:{boot}:{namespace}:{dead.pid}:0")


def test_a_pool_of_an_environment_that_runs_model_code_never_reuses_a_worker():
    """What one episode's code did to its worker (patched the reply code, say) must not reach
    the next episode: PythonREPL declares `runs_model_code`, so each lease gets a fresh worker."""
    from toolgym.builtin_envs.python_repl import PythonREPL

    with SandboxPool(PythonREPL, backend="process", size=1) as pool:
        assert pool.max_uses == 1
        first = pool.lease(timeout=60)
        first.reset(task="t")
        first.close()
        second = pool.lease(timeout=60)
        assert second is not first
        second.close()
    with SandboxPool(Misbehaving, backend="process", size=1) as pool:
        assert pool.max_uses == 0  # environments that run no model code are reused


@pytest.mark.parametrize("where", BACKENDS)
def test_a_seed_draws_the_same_episode_in_a_sandbox_and_here(where):
    """A group resets its members with one seed: sandboxed or not, they start alike (the
    worker passes the seed through the class's reset wrapper), and a limit set by reset
    holds there too."""
    from sandbox_envs import Seeded

    local = toolgym.as_environment(Seeded())
    remote = sandboxed(Seeded, {}, where)
    try:
        firsts = [env.reset(seed=7, turns=2) for env in (local, remote, local)]
        assert firsts[0] == firsts[1] == firsts[2]
        assert remote.reset(seed=8) != firsts[0]
        remote.reset(seed=7, turns=2)
        assert [remote.step(toolgym.ToolCall("draw")).truncated for _ in range(2)] == [False, True]
    finally:
        remote.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_every_hook_crosses_the_sandbox_by_the_protocol_table(where):
    """The worker serves each hook of `toolgym.envs.hooks.INVOKABLE` by its executor
    method: an expert's calls, the episode's metrics, the reward, a final answer, close."""
    from toolgym.builtin_envs.wordle import Wordle

    env = sandboxed(Wordle, {}, where)
    try:
        env.reset(seed=0, answer="crane")
        expert = env.demonstration()
        assert expert[-1] == [toolgym.ToolCall("guess", {"word": "crane"})]
        assert env.episode_metrics()["win"] == 0.0 and env.get_reward() == 0.0
        env.step(expert[-1])
        assert env.episode_metrics()["win"] == 1.0 and env.get_reward() > 0.0
        with pytest.raises(RemoteError, match="not a protocol method"):
            env.executor.request("invoke", name="__init__")
    finally:
        env.close()
