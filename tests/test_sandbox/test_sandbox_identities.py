"""One host identity per live worker (issue 43, family 3): Linux counts descriptors in flight
in SCM_RIGHTS messages, inotify instances, POSIX message-queue bytes, pipe buffer pages and
pending signals per host user, so workers that shared one account let one episode exhaust
them for every other (a victim's session zygote died). Each attack here lets episode A take
one counter to its limit, then checks that episode B, in another worker, is untouched; on
the process and docker backends (`test_ray_attacks.py` runs them through Ray).

Also: the pool hands out each uid once while it lives (a lock per uid, and no uid that any
process still runs as: a crashed host's, a container's), refuses with the reason when it is
exhausted, and the seccomp filter's AIO and POSIX-queue refusals lift only for an
environment that asks. Root only where a pool of uids needs root (the process backend).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sandbox_envs import AioREPL, Prober, QueueREPL

import toolgym
from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.sandbox import ProcessBackend, RemoteEnvironment, SandboxError, sandboxed
from toolgym.sandbox.identities import PoolExhausted, acquire, running_uids

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"
ROOT = os.getuid() == 0
needs_bwrap = pytest.mark.skipif(
    not REQUIRED and shutil.which("bwrap") is None, reason="bubblewrap is not installed"
)
needs_root = pytest.mark.skipif(not ROOT, reason="a pool of host uids needs root")


def _docker_ready() -> bool:
    from toolgym.sandbox.docker import docker_ready

    return docker_ready()


needs_docker = pytest.mark.skipif(
    not REQUIRED and not _docker_ready(), reason="no Docker daemon or sandbox image"
)
BACKENDS = [
    pytest.param("process", marks=[needs_bwrap, needs_root]),
    pytest.param("docker", marks=[needs_docker, pytest.mark.docker]),
]

# What episode A runs to take one per-user counter to its limit ...
HOGS = {
    "descriptors in flight (SCM_RIGHTS)": """
        import os, socket
        a, b = socket.socketpair()
        r, w = os.pipe()
        sent = 0
        try:
            while sent < 5000:
                socket.send_fds(a, [b"x"], [r] * 50)
                sent += 50
        except OSError as error:
            print("stopped", error.strerror)
        print("in flight", sent)
        """,
    "inotify instances": """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        held = []
        while len(held) < 1000:
            fd = libc.inotify_init()
            if fd < 0:
                print("stopped", os.strerror(ctypes.get_errno()))
                break
            held.append(fd)
        print("instances", len(held))
        """,
    "POSIX message-queue bytes": """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        class Attr(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                        ("msgsize", ctypes.c_long), ("cur", ctypes.c_long),
                        ("pad", ctypes.c_long * 4)]
        made = 0
        while made < 1000:
            attr = Attr(0, 10, 8192, 0)
            name = f"/hog{made}".encode()
            if libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr)) < 0:
                print("stopped", os.strerror(ctypes.get_errno()))
                break
            made += 1
        print("queues", made)
        """,
    "pipe buffer pages": """
        import fcntl, os
        pipes = []
        try:
            while len(pipes) < 120:
                r, w = os.pipe()
                pipes.append((r, w))
                fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: 256 pages each
        except OSError as error:
            print("stopped", error.strerror)
        print("pipes", len(pipes))
        """,
    "pending real-time signals": """
        import ctypes, os, signal
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
        libc = ctypes.CDLL(None, use_errno=True)
        queued = 0
        while queued < 200_000:
            if libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(queued)) < 0:
                print("stopped", os.strerror(ctypes.get_errno()))
                break
            queued += 1
        print("queued", queued)
        """,
}
# ... and what episode B then runs: what each would have failed (it did before).
VICTIMS = {
    "descriptors in flight (SCM_RIGHTS)": (
        """
        import os, socket
        a, b = socket.socketpair()
        r, w = os.pipe()
        socket.send_fds(a, [b"x"], [r])
        print("victim sent a descriptor")
        """,
        "victim sent a descriptor",
    ),
    "inotify instances": (
        """
        import ctypes
        print("victim inotify", ctypes.CDLL(None).inotify_init() >= 0)
        """,
        "victim inotify True",
    ),
    "POSIX message-queue bytes": (
        """
        import ctypes, os
        fd = ctypes.CDLL(None).mq_open(b"/victim", os.O_CREAT | os.O_RDWR, 0o600, None)
        print("victim mq_open", fd >= 0)
        """,
        "victim mq_open True",
    ),
    "pipe buffer pages": (
        """
        import fcntl, os
        r, w = os.pipe()
        print("victim pipe size", fcntl.fcntl(w, 1032))
        """,
        "victim pipe size 65536",
    ),
    "pending real-time signals": (
        """
        import ctypes, os, signal
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
        libc = ctypes.CDLL(None)
        print("victim sigqueue", libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), None))
        """,
        "victim sigqueue 0",
    ),
}
HOG_STOPS = {  # the limit A meets, in A's own worker
    "descriptors in flight (SCM_RIGHTS)": "stopped Too many references",
    "inotify instances": "stopped Too many open files",
    "POSIX message-queue bytes": "stopped Too many open files",
    "pipe buffer pages": "stopped Operation not permitted",
    "pending real-time signals": "stopped Resource temporarily unavailable",
}


def run(env, code: str) -> str:
    result = env.step(toolgym.ToolCall("run", {"code": textwrap.dedent(code)}))
    return result.messages[0]["content"]


def host_uid(env) -> int:
    found = re.search(r"host uid (\d+)", env.isolation.user)
    assert found, env.isolation
    return int(found.group(1))


@pytest.mark.parametrize("family", list(HOGS))
@pytest.mark.parametrize("where", BACKENDS)
def test_one_episode_cannot_exhaust_a_per_user_counter_of_another(where, family):
    cls = QueueREPL if "message-queue" in family else PythonREPL  # queues: only when asked
    options = {"run_timeout": 60.0, "max_turns": 50}
    a = sandboxed(cls, options, where, call_timeout=120)
    b = sandboxed(cls, options, where, call_timeout=120)
    try:
        a.reset(task="hog", answer="x")
        hog = run(a, HOGS[family])
        assert HOG_STOPS[family] in hog, hog  # A met its own limit ...
        b.reset(task="victim", answer="x")
        code, expected = VICTIMS[family]
        assert expected in run(b, code)  # ... and B is untouched
        assert "value: 42" in run(b, "6 * 7")  # B's zygote still hands over sessions
        assert host_uid(a) != host_uid(b)
        b.final_answer("x")
        assert b.reward == 1.0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_aio_and_posix_queues_are_refused_unless_the_environment_asks(where):
    """io_setup takes from one quota for the whole host (fs.aio-max-nr): refused, as is
    mq_open; an environment class that names them in `sandbox_allow` gets them."""
    aio = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        context = ctypes.c_ulong(0)
        result = libc.syscall(206, 8, ctypes.byref(context))  # io_setup
        print("io_setup", result, os.strerror(ctypes.get_errno()) if result else "")
        """
    queue = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.mq_open(b"/q", os.O_CREAT | os.O_RDWR, 0o600, None)
        print("mq_open", fd, os.strerror(ctypes.get_errno()) if fd < 0 else "")
        """
    plain = sandboxed(PythonREPL, {}, where)
    asks_aio, asks_queues = sandboxed(AioREPL, {}, where), sandboxed(QueueREPL, {}, where)
    try:
        for env in (plain, asks_aio, asks_queues):
            env.reset(task="t", answer="x")
        assert "io_setup -1 Function not implemented" in run(plain, aio)
        assert "mq_open -1 Operation not permitted" in run(plain, queue)
        assert "io_setup 0" in run(asks_aio, aio)
        assert "mq_open -1 Operation not permitted" in run(asks_aio, queue)
        assert re.search(r"mq_open \d+ ", run(asks_queues, queue))
        assert "io_setup -1" in run(asks_queues, aio)
    finally:
        for env in (plain, asks_aio, asks_queues):
            env.close()


class WrongAllowance(PythonREPL):
    sandbox_allow = ("io_uring",)


def test_an_unknown_allowance_is_a_named_error():
    with pytest.raises(SandboxError, match=r"sandbox_allow names \['io_uring'\]; known: aio"):
        RemoteEnvironment(WrongAllowance, backend=ProcessBackend()).reset()


def _free_range(size: int) -> range:
    """A range of uids no process runs as, apart from the default pool (tests run at once)."""
    busy = running_uids()
    base = 3_000_000 + (os.getpid() % 1000) * 1000
    while any(uid in busy for uid in range(base, base + size)):
        base += size
    return range(base, base + size)


@needs_root
@needs_bwrap
def test_each_live_worker_holds_a_uid_of_its_own_until_it_is_gone():
    uids = _free_range(8)
    backend = ProcessBackend(uids=uids)
    envs = [RemoteEnvironment(Prober, backend=backend) for _ in range(3)]
    try:
        for env in envs:
            env.reset()
        held = [host_uid(env) for env in envs]
        assert len(set(held)) == 3 and all(uid in uids for uid in held), held
        assert set(held) <= running_uids()  # the workers really run as them
        import json

        status = json.loads(envs[0].step(toolgym.ToolCall("status", {})).messages[0]["content"])
        assert status["Uid"].split()[0] == "65534"  # inside, it is still nobody
    finally:
        for env in envs:
            env.close()
    deadline = time.monotonic() + 10
    while set(held) & running_uids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(held) & running_uids(), "a closed worker left a process behind"
    again = [acquire(uids) for _ in range(len(uids))]  # every uid is free again
    for identity in again:
        identity.release()


@needs_root
@needs_bwrap
def test_an_exhausted_pool_refuses_with_the_reason_and_serves_again_after_a_close():
    backend = ProcessBackend(uids=_free_range(2))
    live = [RemoteEnvironment(PythonREPL, backend=backend) for _ in range(2)]  # each starts one
    try:
        for env in live:
            env.reset(task="t", answer="x")  # (a fresh worker: the old one's uid comes back)
        with pytest.raises(PoolExhausted, match=r"all 2 usable host uids .* ProcessBackend\(uids"):
            RemoteEnvironment(PythonREPL, backend=backend)
        live[0].close()
        live.append(RemoteEnvironment(PythonREPL, backend=backend))
        live[-1].reset(task="t", answer="x")
        assert "value: 42" in run(live[-1], "6 * 7")
    finally:
        for env in live:
            env.close()


@needs_root
def test_a_uid_that_any_process_runs_as_is_never_handed_out():
    uids = _free_range(2)

    def become_first() -> None:
        os.setresgid(uids[0], uids[0], uids[0])
        os.setresuid(uids[0], uids[0], uids[0])

    sleeper = subprocess.Popen(["sleep", "60"], preexec_fn=become_first)
    try:
        deadline = time.monotonic() + 5
        while uids[0] not in running_uids() and time.monotonic() < deadline:
            time.sleep(0.05)
        identity = acquire(uids)
        assert identity.uid == uids[1]  # not the one a process (not ours) runs as
        with pytest.raises(PoolExhausted):
            acquire(uids)
        identity.release()
    finally:
        sleeper.kill()
        sleeper.wait()
    identity = acquire(uids)
    identity.release()


@needs_root
@needs_bwrap
def test_a_crashed_host_never_gets_its_uid_handed_out_while_its_worker_lives():
    """A host process killed with SIGKILL drops its lock; its worker dies with it (the
    parent-death signal), and the uid is handed out again only once no process runs as it."""
    uids = _free_range(1)
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        from toolgym.builtin_envs.python_repl import PythonREPL
        from toolgym.sandbox import ProcessBackend, RemoteEnvironment
        backend = ProcessBackend(uids=range({uids.start}, {uids.stop}))
        env = RemoteEnvironment(PythonREPL, backend=backend)
        env.reset(task="t", answer="x")
        print(env.isolation.user, flush=True)
        time.sleep(120)
        """
    )
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        assert f"host uid {uids.start}" in host.stdout.readline()
        with pytest.raises(PoolExhausted):
            acquire(uids)  # held by the live host
        host.send_signal(signal.SIGKILL)
        host.wait()
        deadline = time.monotonic() + 15
        while True:
            try:
                identity = acquire(uids)
                break
            except PoolExhausted:
                assert time.monotonic() < deadline, "the crashed host's uid never came back"
                time.sleep(0.1)
        assert uids.start not in running_uids()  # handed out only once its processes died
        identity.release()
    finally:
        host.kill()
        host.wait()


@needs_root
@needs_docker
@pytest.mark.docker
def test_a_container_and_a_process_worker_never_share_a_uid():
    """Docker's containers take their uid from the same pool: a process-backend worker never
    gets the uid a live container runs as."""
    from toolgym.sandbox.docker import DockerBackend

    uids = _free_range(1)
    container = RemoteEnvironment(Prober, backend=DockerBackend(uids=uids))
    try:
        container.reset()
        assert host_uid(container) == uids.start
        with pytest.raises(PoolExhausted):
            RemoteEnvironment(Prober, backend=ProcessBackend(uids=uids)).reset()
    finally:
        container.close()
    worker = RemoteEnvironment(Prober, backend=ProcessBackend(uids=uids))
    try:
        worker.reset()
        assert host_uid(worker) == uids.start
    finally:
        worker.close()


@needs_bwrap
def test_model_code_is_never_run_without_bubblewrap_unless_allowed():
    """bubblewrap=False used to run a `runs_model_code` class's code as the host user (root
    here) with only a warning; now it is refused, naming the option that allows it."""
    with pytest.raises(SandboxError, match=r"without bubblewrap.*allow_unsandboxed=True"):
        RemoteEnvironment(PythonREPL, backend=ProcessBackend(bubblewrap=False)).reset()
    allowed = ProcessBackend(bubblewrap=False, allow_unsandboxed=True)
    env = RemoteEnvironment(PythonREPL, backend=allowed)
    try:
        env.reset(task="t", answer="x")
        assert any("bubblewrap unavailable" in note for note in env.isolation.notes)
        assert "value: 42" in run(env, "6 * 7")
    finally:
        env.close()
    plain = RemoteEnvironment(Prober, backend=ProcessBackend(bubblewrap=False))
    try:  # a class that runs no model code still may
        plain.reset()
    finally:
        plain.close()
