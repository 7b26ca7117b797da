"""The standing attack suite (`test_sandbox_attacks.py`'s `ATTACKS`, every attack, read from
there so that a new attack is run here too) through a process sandbox hosted in a Ray actor on
the second node of a real two-node loopback cluster (`test_ray_backend.py`'s `Cluster`): model
code sent to `PythonREPL.run` must be held as it is by today's process backend, the grader
must still grade, and the next episode must start clean. Nothing is left behind: no actor.
Skips as `test_ray_backend.py` does (no Ray, no bubblewrap) unless TOOLGYM_REQUIRE_SANDBOXES=1.
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import pytest
import test_ray_backend  # skips without Ray or bubblewrap, unless TOOLGYM_REQUIRE_SANDBOXES=1
from test_ray_backend import _wait, run
from test_sandbox_attacks import _LEAVE_BEHIND, _LOOK_BEHIND, _PREAMBLE, ANSWER, ATTACKS, SECRET

import toolgym
from toolgym.envs.python_repl import PythonREPL
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
