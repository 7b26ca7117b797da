"""The process backend holds against code that looks around: no privilege, no host secrets,
no host sockets, a bounded /tmp, and it works wherever the project lives (/tmp included)."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap

import pytest
from sandbox_envs import Prober

import toolgym
from toolgym.sandbox import (
    ProcessBackend,
    ProcessLimits,
    RemoteEnvironment,
    SandboxError,
    sandboxed,
)

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("TOOLGYM_REQUIRE_SANDBOXES"),
    reason="bubblewrap is not installed (make sandboxes installs it)",
)


def answer(env, tool: str, **arguments):
    result = env.step(toolgym.ToolCall(tool, arguments))
    return result.messages[0]["content"], result.results[0].failure


@pytest.fixture
def prober(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_of_the_host")
    limits = ProcessLimits(tmp_bytes=8 << 20)
    env = RemoteEnvironment(Prober, backend=ProcessBackend(limits=limits))
    env.reset()
    yield env
    env.close()


def test_no_capabilities_no_new_privileges_and_an_unprivileged_uid(prober):
    import json

    status = json.loads(answer(prober, "status")[0])
    assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0000000000000000"
    assert status["NoNewPrivs"] == "1"
    assert status["Uid"].split()[0] == "65534"
    content, _ = answer(prober, "remount_root_read_write")
    assert content.startswith("refused")
    content, _ = answer(prober, "new_user_namespace")  # no namespace of its own to be root in
    assert content.startswith("refused"), content
    assert "no capabilities" in prober.isolation.user


@pytest.mark.parametrize("where", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_worker_never_imports_from_its_writable_folders(where):
    """The worker runs in /tmp, which the model's code can write: a module planted there must
    never shadow one the worker imports later (PYTHONSAFEPATH keeps the folder off sys.path)."""
    import json

    if where == "docker":
        from toolgym.sandbox.docker import docker_ready

        if not docker_ready() and os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") != "1":
            pytest.skip("no Docker daemon or sandbox image")
    env = sandboxed(Prober, {}, where)
    try:
        env.reset()
        path = json.loads(answer(env, "import_path")[0])
        assert "" not in path and "/tmp" not in path and "." not in path, path
    finally:
        env.close()


def test_no_host_secrets_sockets_or_home(prober):
    environment = answer(prober, "environment")[0]
    assert "hf_secret_of_the_host" not in environment and "HF_TOKEN" not in environment
    for path in (
        "/etc/shadow",
        "/run/docker.sock",
        "/var/run/docker.sock",
        "/home",
        "/root/.bashrc",
    ):
        assert answer(prober, "exists", path=path)[0] == "false", path
    # beside the environment's module: only the module itself is visible
    sibling = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers.py")
    assert answer(prober, "exists", path=sibling)[0] == "false"
    assert answer(prober, "exists", path=os.path.abspath(__file__))[0] == "false"


def test_tmp_is_private_and_bounded(prober):
    content, failure = answer(
        prober, "fill", path="/tmp/fill", megabytes=32
    )  # /tmp holds 8 MiB here
    assert failure == "tool_exception" and "No space left" in content
    content, failure = answer(
        prober, "fill", path="/dev/shm/fill", megabytes=32
    )  # so does /dev/shm
    assert failure == "tool_exception" and "No space left" in content
    assert answer(prober, "exists", path="/tmp/fill")[0] == "true"  # its own /tmp
    assert not os.path.exists("/tmp/fill") or os.path.getsize("/tmp/fill") < (8 << 20) + 1


def test_an_environment_module_under_tmp_is_importable(tmp_path, monkeypatch):
    """A project or virtual environment under /tmp stays visible over the private /tmp."""
    assert str(tmp_path).startswith("/tmp")
    (tmp_path / "tmp_project_env.py").write_text(
        textwrap.dedent(
            '''
            import toolgym

            class Echo(toolgym.Environment):
                def reset(self) -> None:
                    self.reward = 0.0

                def echo(self, text: str) -> str:
                    """Echo.

                    Args:
                        text: Anything.
                    """
                    return text
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__("tmp_project_env")
    env = RemoteEnvironment(module.Echo, backend=ProcessBackend())
    try:
        env.reset()
        assert answer(env, "echo", text="from /tmp")[0] == "from /tmp"
    finally:
        env.close()
        sys.modules.pop("tmp_project_env", None)


class WritableImportPath(ProcessBackend):
    """Puts a folder the sandbox can write on the worker's import path (as a project cloned
    under /tmp did): the worker must refuse to start (`toolgym/sandbox/boot.py`)."""

    def _launch(self, target):
        launch = super()._launch(target)
        entries = launch.env["TOOLGYM_SYS_PATH"]
        launch.env["TOOLGYM_SYS_PATH"] = os.pathsep.join(["/tmp/no-sandbox-today", entries])
        launch.env["TOOLGYM_CHECK_SYS_PATH"] = "1"
        return launch


def test_a_worker_that_dies_at_start_says_why():
    """A worker that refuses to start (a folder the sandbox could write on its import path)
    is a SandboxError carrying the end of its stderr: the reason."""
    expected = (
        r"(?s)died during start \(exit code 78; its stderr ended with: toolgym worker refused "
        r"to start: the import path entry /tmp/no-sandbox-today is missing and /tmp, where it "
        r"would be made, is writable by the sandbox"
    )
    with pytest.raises(SandboxError, match=expected):
        RemoteEnvironment(Prober, backend=WritableImportPath()).reset()


def test_a_nan_reward_never_poisons_a_group():
    """A reward that is not a finite number never reaches the advantages: locally the reward
    check ends the episode env_error (the environment's own fault); in a sandbox the NaN
    breaks the protocol during the model's call (code that reached the environment wrote it),
    which is the model's `tool_crash`, scored with the last finite reward."""
    from helpers import ids

    from toolgym.agents import Agent, ScriptedEngine
    from toolgym.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    reply = '<tool_call>\n{"name": "poison_reward", "arguments": {}}\n</tool_call><|im_end|>'
    for backend, status in (("local", "env_error"), (ProcessBackend(), "tool_crash")):
        env = Prober() if backend == "local" else RemoteEnvironment(Prober, backend=backend)
        agent = Agent(ScriptedEngine([ids(tokenizer, reply)]), tokenizer, parser="hermes")
        agent.limits.max_turns = 1
        (trajectory,) = agent.run([env], [{"prompt": "go"}])
        assert trajectory.status == status, trajectory.error
        # locally the reward check says so; a sandbox's NaN breaks the protocol (no JSON)
        assert "not a finite number" in trajectory.error or "NaN" in trajectory.error
        assert trajectory.reward == 0.0
        env.close()


def test_a_worker_that_stops_reading_cannot_hang_the_host():
    """Model code that stops the worker reading its requests: the host's write times out
    (it used to block forever, holding the channel), the worker is killed, reset recovers."""
    import time

    env = RemoteEnvironment(Prober, backend=ProcessBackend(), call_timeout=3.0)
    try:
        env.reset()
        assert answer(env, "stop_reading")[0] == "deaf"
        started = time.monotonic()
        result = env.step(toolgym.ToolCall("read", {"path": "x" * 300_000}))
        assert time.monotonic() - started < 20
        assert result.info["ended"] == "tool_timeout", result.info  # the model's doing
        assert "stopped reading requests" in result.info["error"]
        env.reset()
        assert answer(env, "exists", path="/tmp")[0] == "true"
    finally:
        env.close()


def test_a_host_holding_many_descriptors_still_starts_workers():
    """Until exec the child holds the host's descriptors (a few per live worker): with the
    open-files limit set first, the 64th worker of one host process failed to start. The
    limits now come last; 300 open descriptors stand in for 64 workers."""
    import os

    pipes = [os.pipe() for _ in range(150)]
    env = RemoteEnvironment(Prober, backend=ProcessBackend(), call_timeout=10.0)
    try:
        env.reset()
        assert answer(env, "exists", path="/tmp")[0] == "true"
        isolation = env.isolation
    finally:
        env.close()
        for read, write in pipes:
            os.close(read)
            os.close(write)
    assert env.isolation is isolation  # a closed instance starts no worker to answer
    assert not env.alive
