"""A Python session's namespace copied into another session (`PythonSession.image`), and the
`PythonREPL` snapshots and forks built on it (issue 46 item 2: state a model's code built)."""

from __future__ import annotations

import os
import pickle
import tempfile
import uuid

import pytest
from sandbox_marks import needs_bwrap, needs_docker

import toolgym
from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.envs.snapshots import NotForkable
from toolgym.sandbox import sandboxed
from toolgym.sandbox.python_session import PythonSession, SessionImageError

STATE = """
import math, collections
from dataclasses import dataclass, field
shared = [1, 2]
alias = shared
def fact(n):
    return 1 if n < 2 else n * fact(n - 1)
square = lambda v: v * v
def counter():
    count = 0
    def step():
        nonlocal count
        count += 1
        return count
    return step
tick = counter(); tick(); tick()
class Base:
    k = 3
    def value(self):
        return self.k + math.floor(2.5)
    @property
    def ten(self):
        return 10
    @classmethod
    def make(cls):
        return cls()
class Child(Base):
    __slots__ = ("extra",)
    def value(self):
        return super().value() * 2
@dataclass
class Point:
    x: int
    tags: list = field(default_factory=list)  # needs real annotations in the session
child = Child(); child.extra = "e"
point = Point(1)
letters = collections.Counter("hello")
import os
with open("notes.txt", "w") as f:
    f.write("kept")
os.makedirs("deep/er")
with open("deep/er/run.sh", "w") as f:
    f.write("echo hi")
os.chmod("deep/er/run.sh", 0o750)
"""

CHECK = """
assert alias is shared and shared == [1, 2]
assert fact(5) == 120 and square(4) == 16 and tick() == 3
assert child.value() == 10 and child.ten == 10 and child.extra == "e"
assert isinstance(Child.make(), Base) and isinstance(child, Base)
assert point == Point(1) and repr(point) == "Point(x=1, tags=[])"
assert letters["l"] == 2 and math.pi > 3
assert open("notes.txt").read() == "kept" and open("deep/er/run.sh").read() == "echo hi"
assert os.stat("deep/er/run.sh").st_mode & 0o777 == 0o750
"ok"
"""


def test_an_image_carries_what_the_code_defined_into_an_independent_session():
    with PythonSession() as source, PythonSession() as copy:
        assert source.image() is None  # nothing ran yet: no process, nothing to copy
        assert not source.run(STATE).stderr
        copy.load_image(source.image() or b"")
        assert copy.run(CHECK).value == "'ok'", copy.run(CHECK)
        assert copy.run("import os; os.getpid()").value != source.run("os.getpid()").value
        copy.run("shared.append(3)\nwith open('notes.txt', 'w') as f: f.write('changed')")
        assert source.run("shared").value == "[1, 2]"  # independent from here on
        assert source.run("tick()").value == "3"
        assert source.run("open('notes.txt').read()").value == "'kept'"
        folders = [eval(each.run("os.getcwd()").value or "") for each in (source, copy)]
        assert folders[0] != folders[1] and all(os.path.isdir(each) for each in folders)
    assert not any(os.path.exists(each) for each in folders)  # removed with their sessions


def test_what_an_image_cannot_carry_is_named_and_the_session_lives_on():
    with PythonSession() as session:
        session.run("x = 41\ng = (i for i in range(3))\nimport threading\nlock = threading.Lock()")
        with pytest.raises(SessionImageError, match=r"g \(generator.*lock \(lock"):
            session.image()
        session.run("import types\nbuilt = types.ModuleType('built')\ndel g, lock")
        with pytest.raises(SessionImageError, match=r"built \(module.*built, not imported"):
            session.image()
        assert session.run("x + 1").value == "42"


def test_a_damaged_image_does_not_load_and_says_so():
    with PythonSession() as session:
        with pytest.raises(SessionImageError, match="did not load"):
            session.load_image(b"not a pickle")
        assert session.run("1 + 1").value == "2"  # the next run starts afresh
        name = f"escaped-{uuid.uuid4().hex}"  # beside the session's folder, in the temp dir
        escape = {"names": {}, "files": {f"../{name}": (0o644, b"x")}}
        with pytest.raises(SessionImageError, match="a file outside the working folder"):
            session.load_image(pickle.dumps(escape))
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), name))


@pytest.mark.parametrize(
    "forged",
    [
        "({'image': 10**12}, b'')",  # announces more than the limit
        "({'image': 2}, b'abcdef')",  # sends more than it announced
        "({'image': 'many'}, b'')",  # a header that is not one
    ],
    ids=["oversized", "overlong", "unreadable"],
)
def test_a_session_that_forges_its_image_reply_is_stopped(forged):
    """The model's code may replace the session's own image code: whatever it sends, the
    host reads at most the limit and what was announced, and a broken reply ends the
    session (its state is lost) with a readable error."""
    with PythonSession() as session:
        planted = session.run(f"import sys\nsys.modules['__main__']._image = lambda *a: {forged}")
        assert not planted.stderr, planted
        with pytest.raises(SessionImageError, match=r"broke its protocol.*state is lost"):
            session.image()
        assert session.run("'fresh' if 'sys' not in dir() else 'old'").value == "'fresh'"


def test_the_host_never_unpickles_an_image(monkeypatch):
    """An image is the model's bytes: only a session (where the model's code runs anyway)
    unpickles it. With pickle's loading refused in this process, a REPL still forks."""

    def refused(*args, **kwargs):
        raise AssertionError("the host unpickled an image")

    env = toolgym.as_environment(PythonREPL())
    env.reset(task="t", answer="1")
    env.step(toolgym.ToolCall("run", {"code": STATE}))
    monkeypatch.setattr(pickle, "loads", refused)
    monkeypatch.setattr(pickle, "load", refused)
    (fork,) = env.fork(1)
    try:
        assert (
            fork.step(toolgym.ToolCall("run", {"code": CHECK}))
            .messages[0]["content"]
            .endswith("value: 'ok'")
        )
    finally:
        fork.close()
        env.close()


def _run(env, code: str) -> str:
    return env.step(toolgym.ToolCall("run", {"code": code})).messages[0]["content"]


BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("process", id="process", marks=[needs_bwrap]),
    pytest.param("docker", id="docker", marks=[needs_docker, pytest.mark.docker]),
]


@pytest.mark.parametrize("where", BACKENDS)
def test_a_repl_forks_with_the_state_its_code_built(where):
    """Each fork's session is a process of its own (on the process backend: in a worker of
    its own) holding the source's names; what a fork does reaches neither its source nor its
    sibling; `restore` goes back to the namespace of the snapshot."""
    env = toolgym.make("PythonREPL-v0", sandbox=where)
    copies = []
    try:
        env.reset(task="t", answer="1")
        assert "Traceback" not in _run(env, STATE + "\nimport os\nsource_pid = os.getpid()")
        snap = env.snapshot()
        copies = env.fork(2)
        for number, copy in enumerate(copies):
            assert _run(copy, CHECK).endswith("value: 'ok'")
            if where == "local":  # one PID namespace (a sandbox's worker has its own)
                assert _run(copy, "os.getpid() != source_pid").endswith("value: True")
            _run(copy, f"shared.append({number})")
        assert _run(copies[0], "shared").endswith("value: [1, 2, 0]")
        assert _run(copies[1], "shared").endswith("value: [1, 2, 1]")
        assert _run(env, "shared").endswith("value: [1, 2]")
        _run(env, "shared.clear()")
        env.restore(snap)
        assert _run(env, "shared, tick()").endswith("value: ([1, 2], 3)")
        if where != "local":  # three workers, each with a host identity of its own as root
            assert len({id(each.executor.channel) for each in (env, *copies)}) == 3
            if os.geteuid() == 0:
                assert len({each.isolation.user for each in (env, *copies)}) == 3
    finally:
        for each in (env, *copies):
            each.close()


@needs_bwrap
def test_a_repl_whose_state_is_over_the_channel_s_limit_is_not_forkable(monkeypatch):
    from toolgym.sandbox.process import ProcessChannel

    monkeypatch.setattr(ProcessChannel, "snapshot_bytes", 100_000)
    env = sandboxed(PythonREPL, {}, "process")
    try:
        env.reset(task="t", answer="1")
        _run(env, "blob = bytes(200_000)")
        with pytest.raises(NotForkable, match="over the 100,000 characters a snapshot may carry"):
            env.fork(1)
        assert _run(env, "len(blob)").endswith("value: 200000")
    finally:
        env.close()


def test_an_image_over_the_limit_is_refused_as_it_passes_it(monkeypatch):
    """The session stops pickling once the image passes the limit (it never holds more), says
    so, and lives on with its state."""
    from toolgym.sandbox import python_session

    monkeypatch.setattr(python_session, "IMAGE_LIMIT", 1_000_000)
    with PythonSession() as session:
        session.run("blob = bytes(3_000_000)")
        with pytest.raises(SessionImageError, match="over the 1,000,000 bytes an image may be"):
            session.image()
        assert session.run("len(blob)").value == "3000000"


def test_a_backend_s_image_budget_binds(monkeypatch):
    """`TOOLGYM_IMAGE_BYTES` (Docker's eighth of its memory) bounds an image below the rest."""
    monkeypatch.setenv("TOOLGYM_IMAGE_BYTES", "500000")
    with PythonSession() as session:
        session.run("blob = bytes(600_000)")
        with pytest.raises(SessionImageError, match="over the 500,000 bytes"):
            session.image()


@needs_bwrap
def test_a_snapshot_restores_only_where_it_fits(monkeypatch):
    """A snapshot taken where more fits is refused by name where less does (a process
    sandbox's into a smaller one), before the new worker could run out of memory."""
    from toolgym.sandbox.process import ProcessChannel

    env = sandboxed(PythonREPL, {}, "process")
    other = sandboxed(PythonREPL, {}, "process")
    try:
        env.reset(task="t", answer="1")
        _run(env, "blob = bytes(200_000)")
        snap = env.snapshot()
        other.reset(task="t", answer="1")
        monkeypatch.setattr(ProcessChannel, "snapshot_bytes", 100_000)
        with pytest.raises(NotForkable, match="over the 100,000 this sandbox can take"):
            other.restore(snap)
    finally:
        env.close()
        other.close()
