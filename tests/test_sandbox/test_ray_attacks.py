"""The standing attack suite (`test_sandbox_attacks.py`'s `ATTACKS`, every attack, read from
there so that a new attack is run here too) through a process sandbox hosted in a Ray actor on
the second node of a real two-node loopback cluster (`test_ray_backend.py`'s `Cluster`): model
code sent to `PythonREPL.run` must be held as it is by today's process backend, the grader
must still grade, and the next episode must start clean. Nothing is left behind: no actor.
Skips as `test_ray_backend.py` does (no Ray, no bubblewrap) unless TOOLGYM_REQUIRE_SANDBOXES=1.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path

import pytest
import test_ray_backend  # skips without Ray or bubblewrap, unless TOOLGYM_REQUIRE_SANDBOXES=1
from test_ray_backend import _wait, run
from test_sandbox_attacks import _LEAVE_BEHIND, _LOOK_BEHIND, _PREAMBLE, ANSWER, ATTACKS, SECRET
from test_sandbox_identities import HOG_STOPS, HOGS, VICTIMS
from test_sandbox_import_path import grade_after_planting, write_lazy_grader

import toolgym
from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.sandbox import sandboxed
from toolgym.sandbox.imports import TOOLGYM_SOURCE
from toolgym.sandbox.ray_backend import RayBackend, list_sandbox_actors

pytestmark = pytest.mark.slow
cluster = test_ray_backend.cluster  # the fixture: a cluster of this module's own
INNER = "process"
"""The inner sandbox, and the backend name the attacks' checks are read for."""


@pytest.fixture(scope="module")
def host_service():
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture(scope="module")
def ray_repl(cluster):
    """One PythonREPL in a Ray actor on node "b", reused across attacks (each starts with
    reset); the host has a secret in its environment and beside the project that no attack
    may read."""
    canaries = [
        TOOLGYM_SOURCE.parent / ".toolgym-attack-canary",
        Path(tempfile.gettempdir()) / ".toolgym-attack-canary",
    ]
    for canary in canaries:
        canary.write_text(SECRET)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HF_TOKEN", SECRET)
            options = {"run_timeout": 3.0, "max_turns": 10_000}
            backend = RayBackend(resources={"b": 1}, inner=INNER)
            env = sandboxed(PythonREPL, options, backend, call_timeout=30)
            yield env, cluster.node_with("b")["NodeID"]
            env.close()
        _wait(lambda: not list_sandbox_actors(), 60, f"actors left: {list_sandbox_actors()}")
    finally:
        for canary in canaries:
            canary.unlink(missing_ok=True)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_attack_is_held_in_a_ray_hosted_process_sandbox(ray_repl, host_service, name):
    (env, node), attack = ray_repl, ATTACKS[name]
    env.reset(task="attack", answer=ANSWER)
    assert env.isolation.node_id == node and env.isolation.inner == INNER
    restarts = env.restarts
    code = _PREAMBLE + f"PORT = {host_service}\n" + textwrap.dedent(attack.code)
    attack.held(run(env, code), INNER)
    assert env.reward == 0.0 and not env.done  # nothing forged reached the grader
    if INNER in attack.later_runs_fail:
        result = env.step(toolgym.ToolCall("run", {"code": "6 * 7"}))
        # the model reads why (PythonREPL answers a ToolError; it raised before that change)
        assert result.results[0].failure in ("tool_error", "tool_exception"), result.messages
        assert "session zygote is gone" in result.messages[0]["content"]
    else:
        for _ in range(3):  # honest replies only, however many were forged ahead
            assert "value: 42" in run(env, "6 * 7")
        env.final_answer(ANSWER)
        assert env.reward == 1.0 and env.done  # the grader grades
    assert env.restarts == restarts, "the worker survived the attack"
    env.reset(task="next", answer=ANSWER)  # the next episode starts clean: a fresh worker
    assert env.restarts == restarts + 1
    assert "NameError" in run(env, "block")
    assert env.reward == 0.0
    for leaked in ("/etc/attack", "/usr/attack", "/var/tmp/attack", "/attack"):
        assert not Path(leaked).exists()
    assert not (TOOLGYM_SOURCE / "attack.py").exists()


def test_nothing_reaches_the_next_episode(ray_repl):
    """Files in /tmp and /dev/shm, a SysV queue and a keyring key written in one episode are
    gone in the next one on the same instance."""
    env, _ = ray_repl
    env.reset(task="first", answer=ANSWER)
    run(env, _LEAVE_BEHIND)
    assert "found ['/tmp/left-behind', '/dev/shm/left-behind']" in run(env, _LOOK_BEHIND)
    env.reset(task="second", answer=ANSWER)
    assert "found []" in run(env, _LOOK_BEHIND)


@pytest.mark.parametrize(
    "family",
    ["descriptors in flight (SCM_RIGHTS)", "inotify instances", "pending real-time signals"],
)
def test_one_episode_cannot_exhaust_a_per_user_counter_of_another_on_a_node(cluster, family):
    """Two Ray-hosted workers on node "b": A takes a per-user kernel counter to its limit, B
    is untouched (each worker runs as a host uid of its own on the node)."""
    import re

    before = set(list_sandbox_actors())  # (the module's REPL may hold one)
    backend = RayBackend(resources={"b": 0.5, "num_cpus": 0.5}, inner=INNER)
    options = {"run_timeout": 60.0, "max_turns": 50}
    a = sandboxed(PythonREPL, options, backend, call_timeout=120)
    b = sandboxed(PythonREPL, options, backend, call_timeout=120)
    try:
        a.reset(task="hog", answer="x")
        assert HOG_STOPS[family] in run(a, textwrap.dedent(HOGS[family]))
        b.reset(task="victim", answer="x")
        code, expected = VICTIMS[family]
        assert expected in run(b, textwrap.dedent(code))
        assert "value: 42" in run(b, "6 * 7")
        uids = [re.search(r"host uid (\d+)", env.isolation.user) for env in (a, b)]
        if os.getuid() == 0:
            assert all(uids) and uids[0].group(1) != uids[1].group(1), [a.isolation, b.isolation]
    finally:
        a.close()
        b.close()
    _wait(lambda: set(list_sandbox_actors()) <= before, 60, f"left: {list_sandbox_actors()}")


def test_a_module_planted_by_the_model_never_reaches_a_lazy_grader_on_a_node(cluster, tmp_path):
    """The environment's module under /tmp (imported by the actor through Ray's runtime
    environment): the model's code plants `fractions.py` wherever it can; a wrong answer
    still scores 0."""
    import importlib
    import sys

    before = set(list_sandbox_actors())  # (the module's REPL may hold one)
    folder = tmp_path / "project"
    write_lazy_grader(folder)
    sys.path.insert(0, str(folder))
    try:
        grader = importlib.import_module("lazy_grader_env").LazyGrader
        backend = RayBackend(
            resources={"b": 1}, inner=INNER, runtime_env={"env_vars": {"PYTHONPATH": str(folder)}}
        )
        env = sandboxed(grader, {"run_timeout": 20.0}, backend, call_timeout=60)
        try:
            known = [str(folder), str(TOOLGYM_SOURCE.parent), str(TOOLGYM_SOURCE)]
            read, wrong, right = grade_after_planting(env, known)
        finally:
            env.close()
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("lazy_grader_env", None)
    assert "planted ['" in read and "'/tmp'" in read, read
    assert wrong == 0.0, read
    assert right == 1.0
    _wait(lambda: set(list_sandbox_actors()) <= before, 60, f"left: {list_sandbox_actors()}")
