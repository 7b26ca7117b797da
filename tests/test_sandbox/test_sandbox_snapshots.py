"""Snapshots and forks of sandboxed environments (issue 46 item 2, the process and Docker
backends, first version): the worker pickles the episode's state, the host keeps it opaque
(it never unpickles what the model's code could have shaped), and a fork is a fresh sandbox
(its own worker, identity and limits) with the state restored in it."""

from __future__ import annotations

import os

import pytest
from sandbox_envs import Keeper, Scratchpad
from sandbox_marks import needs_bwrap, needs_docker

import toolgym
from toolgym.builtin_envs.python_repl import PythonREPL
from toolgym.envs.snapshots import NotForkable
from toolgym.sandbox import sandboxed

BACKENDS = [
    pytest.param("process", id="process", marks=[needs_bwrap]),
    pytest.param("docker", id="docker", marks=[needs_docker, pytest.mark.docker]),
]


def call(env, name: str, **arguments):
    return env.step(toolgym.ToolCall(name, arguments)).messages[0]["content"]


@pytest.mark.parametrize("where", BACKENDS)
def test_a_sandboxed_episode_forks_into_fresh_sandboxes_and_restores(where):
    env = sandboxed(Keeper, {}, where)
    copies = []
    try:
        env.reset()
        assert call(env, "keep", text="a") == "1"
        snap = env.snapshot()
        assert isinstance(snap.environment["pickled"], str)  # opaque to the host
        copies = env.fork(2)
        assert call(copies[0], "keep", text="b") == "2" and call(copies[1], "keep", text="c") == "2"
        assert call(env, "keep", text="d") == "2"  # each copy went on alone
        channels = {id(e.executor.channel) for e in (env, *copies)}
        assert len(channels) == 3 and all(e.alive for e in copies)  # three workers
        if os.geteuid() == 0:  # a root host gives each worker a host identity of its own
            assert len({e.isolation.user for e in (env, *copies)}) == 3
        env.restore(snap)
        assert call(env, "keep", text="e") == "2" and copies[0].turn == env.turn
    finally:
        for each in (env, *copies):
            each.close()
    assert not any(each.alive for each in (env, *copies))


@needs_bwrap
def test_the_host_never_unpickles_what_a_worker_wrote(tmp_path):
    canary = tmp_path / "unpickled-on-the-host"
    env = sandboxed(Keeper, {}, "process")
    copies = []
    try:
        env.reset()
        assert call(env, "plant", path=str(canary)) == "planted"
        env.snapshot()
        copies = env.fork()  # unpickled in the new worker, which cannot write the host's files
    finally:
        for each in (env, *copies):
            each.close()
    assert not canary.exists()


@needs_bwrap
def test_state_a_worker_cannot_copy_is_named():
    env = sandboxed(PythonREPL, {}, "process")
    try:
        env.reset(task="t", answer="1")
        call(env, "run", code="x = 41\ng = (i for i in range(3))")  # a live generator
        with pytest.raises(
            NotForkable, match=r"PythonREPL in a sandbox: .*cannot be copied: g \(generator"
        ):
            env.snapshot()
        assert call(env, "run", code="print(x + 1)").strip().endswith("42")  # still usable
    finally:
        env.close()


@pytest.mark.parametrize("where", BACKENDS)
def test_a_fork_shares_no_files_descriptors_or_identity_with_its_source(where):
    """The fork attacks: a fork starts with a copy of its source's /tmp, and from then on
    what either writes there is its own; a descriptor number kept in the state names nothing
    of the source's in the fork; each worker has its own channel and, on a root host, its own
    host identity."""
    env = sandboxed(Scratchpad, {}, where)
    copies = []
    try:
        env.reset()
        assert call(env, "write", file="secret", text="the source's secret") == "written"
        assert int(call(env, "hold", file="secret")) > 2
        assert call(env, "read_held") == "the source's secret"
        (fork,) = copies = env.fork(1)
        assert call(fork, "read", file="secret") == "the source's secret"  # a copy
        assert "secret" not in call(fork, "read_held")  # the number, not the source's file
        assert call(fork, "write", file="secret", text="the fork's") == "written"
        assert call(fork, "write", file="planted", text="from the fork") == "written"
        assert call(env, "read", file="planted").startswith("unreadable")
        assert call(env, "read", file="secret") == "the source's secret"
        assert call(env, "read_held") == "the source's secret"  # the source's own file is intact
        assert call(env, "write", file="later", text="after the fork") == "written"
        assert call(fork, "read", file="later").startswith("unreadable")
        assert fork.executor.channel is not env.executor.channel
        if os.geteuid() == 0:
            assert fork.isolation.user != env.isolation.user
    finally:
        for each in (env, *copies):
            each.close()
    assert not any(each.alive for each in (env, *copies))


@pytest.mark.parametrize("where", BACKENDS)
def test_a_restore_brings_back_the_worker_s_tmp(where):
    """`restore` puts /tmp back as it was at the snapshot (files since then go, a folder the
    code made read-only included); only links that point downward are carried (one to a file
    outside /tmp, or one that climbs with `..`, is not)."""
    env = sandboxed(PythonREPL, {}, where)
    copies = []
    try:
        env.reset(task="t", answer="1")
        call(env, "run", code="import os\nos.makedirs('/tmp/a/b')")
        call(env, "run", code="open('/tmp/a/b/f', 'w').write('1')")
        call(env, "run", code="os.symlink('/etc/hostname', '/tmp/out')\nos.symlink('a', '/tmp/in')")
        call(env, "run", code="os.symlink('in/../..', '/tmp/up')\nos.chmod('/tmp/a/b', 0o500)")
        snap = env.snapshot()
        call(env, "run", code="os.chmod('/tmp/a/b', 0o700); open('/tmp/a/b/f', 'w').write('2')")
        locked = "os.makedirs('/tmp/l/m/n'); os.chmod('/tmp/l/m', 0); os.chmod('/tmp/l', 0o500)"
        call(env, "run", code=f"open('/tmp/new', 'w').close(); {locked}")
        env.restore(snap)  # what the code locked goes all the same
        own = "os.lstat('/tmp/' + n).st_dev == os.lstat('/tmp').st_dev"  # not a mount there
        names = f"sorted(n for n in os.listdir('/tmp') if not n.startswith('toolgym-') and {own})"
        sessions = "len([n for n in os.listdir('/tmp') if n.startswith('toolgym-session-')])"
        mode = "oct(os.stat('/tmp/a/b').st_mode & 0o777)"
        listing = f"{names}, open('/tmp/a/b/f').read(), os.readlink('/tmp/in'), {mode}, {sessions}"
        shown = call(env, "run", code=f"import os\n{listing}")
        # no 'new', 'l', 'out' or 'up'; the mode back; the live session's folder only
        assert shown.endswith("value: (['a', 'in'], '1', 'a', '0o500', 1)"), shown

        (fork,) = copies = env.fork(1)
        assert call(fork, "run", code=f"import os\n{listing}") == shown
    finally:
        for each in (env, *copies):
            each.close()


@needs_bwrap
def test_a_sandbox_s_tmp_never_lands_in_the_host_s(tmp_path):
    """A snapshot that carries a sandbox's /tmp restores only into a worker whose /tmp is its
    own: a process worker without bubblewrap shares the host's, and refuses by name."""
    from toolgym.sandbox.process import ProcessBackend

    env = sandboxed(Scratchpad, {}, "process")
    bare = sandboxed(Scratchpad, {}, ProcessBackend(bubblewrap=False))
    try:
        env.reset()
        assert call(env, "write", file=f"{tmp_path.name}-copy", text="x") == "written"
        bare.reset()
        with pytest.raises(NotForkable, match="this worker's /tmp is not its own"):
            bare.restore(env.snapshot())
        bare_copy = bare.snapshot()  # and a bare worker's snapshot carries no /tmp
        assert not os.path.exists(f"/tmp/{tmp_path.name}-copy")  # the bare worker's /tmp
        env.restore(bare_copy)
        assert call(env, "read", file=f"{tmp_path.name}-copy") == "x"  # left as it was
    finally:
        env.close()
        bare.close()


@needs_bwrap
def test_files_over_the_limit_are_refused_before_they_are_read(monkeypatch):
    """A sparse file costs its size: counted before it is read, so a huge one is a quick,
    named `NotForkable` (not the worker's memory)."""
    from toolgym.sandbox.process import ProcessChannel

    monkeypatch.setattr(ProcessChannel, "snapshot_bytes", 1_000_000)
    env = sandboxed(PythonREPL, {}, "process")
    try:
        env.reset(task="t", answer="1")
        sparse = "import os\nos.truncate(open('/tmp/huge', 'wb').name, 50 * 2**20)"
        made = call(env, "run", code=sparse)
        assert "Traceback" not in made, made
        with pytest.raises(NotForkable, match=r"files in /tmp are over the [0-9,]* bytes left"):
            env.snapshot()
    finally:
        env.close()


@pytest.fixture
def fake_tmp(tmp_path, monkeypatch):
    """A folder standing in for a worker's private /tmp (the unpacking code's own, in this
    process): never this machine's /tmp."""
    import tempfile

    from toolgym.sandbox import tmp_copy

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setattr(tmp_copy, "private_tmp", lambda: True)
    return folder


def test_unpacking_keeps_files_and_downward_links_only(fake_tmp, tmp_path):
    from toolgym.sandbox import tmp_copy

    (fake_tmp / "a" / "b").mkdir(parents=True)
    (fake_tmp / "a" / "b" / "f").write_text("1")
    (fake_tmp / "a" / "b").chmod(0o500)
    (fake_tmp / "in").symlink_to("a/b")
    (fake_tmp / "up").symlink_to("in/../..")
    (fake_tmp / "out").symlink_to(tmp_path)
    os.mkfifo(fake_tmp / "fifo")
    archive = tmp_copy.pack(10**6)
    (fake_tmp / "a" / "b").chmod(0o700)
    (fake_tmp / "a" / "b" / "f").write_text("2")
    (fake_tmp / "later").write_text("x")
    tmp_copy.replace(archive, lambda: None)
    assert sorted(os.listdir(fake_tmp)) == ["a", "in"]  # no later, up, out or fifo
    assert (fake_tmp / "in" / "f").read_text() == "1"
    assert (fake_tmp / "a" / "b").stat().st_mode & 0o777 == 0o500  # modes come back


def test_a_failed_restore_puts_tmp_back(fake_tmp):
    """A restore is all or nothing: if the environment's own restore fails after /tmp was
    replaced, /tmp is as it was before."""
    from toolgym.sandbox import tmp_copy

    (fake_tmp / "old").write_text("snapshot")
    archive = tmp_copy.pack(10**6)
    (fake_tmp / "old").write_text("now")
    (fake_tmp / "deep" / "er").mkdir(parents=True)

    def failing():
        assert (fake_tmp / "old").read_text() == "snapshot"  # replaced by now
        raise NotForkable("the environment's state did not load")

    with pytest.raises(NotForkable, match="did not load"):
        tmp_copy.replace(archive, failing)
    assert sorted(os.listdir(fake_tmp)) == ["deep", "old"]
    assert (fake_tmp / "old").read_text() == "now"


def test_an_archive_cannot_write_outside_tmp_or_into_what_is_not_its_own(fake_tmp, tmp_path):
    """Names a worker's own archive never has (`./x`, `a/../b`, `../x`, absolute) are left
    out, as is anything under an entry /tmp already holds that is not its own."""
    import io
    import tarfile

    from toolgym.sandbox import python_session, tmp_copy

    (fake_tmp / "live").mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("./live/a", "x/../live/b", "../escaped", str(tmp_path / "abs"), "ok"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    live = {str(fake_tmp / "live")}
    original = python_session.live_folders
    try:
        python_session.live_folders = lambda: live  # a live session's working folder
        tmp_copy.replace(buffer.getvalue(), lambda: None)
    finally:
        python_session.live_folders = original
    assert sorted(os.listdir(fake_tmp)) == ["live", "ok"] and not os.listdir(fake_tmp / "live")
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "abs").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_a_tmp_with_other_users_files_is_never_cleared(fake_tmp):
    """A second guard besides the backend's word: the host's /tmp holds other users' files,
    a sandbox's own never does; nothing is removed."""
    from toolgym.sandbox import tmp_copy

    (fake_tmp / "mine").write_text("kept")
    (fake_tmp / "theirs").write_text("kept")
    os.chown(fake_tmp / "theirs", 65534, 65534)
    with pytest.raises(NotForkable, match="files of other users"):
        tmp_copy.replace(tmp_copy.pack(10**6), lambda: None)
    assert sorted(os.listdir(fake_tmp)) == ["mine", "theirs"]


def test_a_tmp_the_backend_does_not_vouch_for_is_never_replaced(tmp_path, monkeypatch):
    from toolgym.sandbox import tmp_copy

    monkeypatch.delenv("TOOLGYM_PRIVATE_TMP", raising=False)
    with pytest.raises(NotForkable, match="not its own"):
        tmp_copy.replace(b"", lambda: None)


@needs_bwrap
def test_files_the_code_made_unreadable_make_a_named_refusal():
    env = sandboxed(PythonREPL, {}, "process")
    try:
        env.reset(task="t", answer="1")
        call(env, "run", code="import os\nopen('/tmp/shut', 'w').close(); os.chmod('/tmp/shut', 0)")
        with pytest.raises(NotForkable, match=r"/tmp cannot be copied: .*shut"):
            env.snapshot()
    finally:
        env.close()
