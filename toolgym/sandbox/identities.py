"""One host identity per live worker: a pool of host uids (and equal gids), one held by each
process-backend worker or docker container while it lives.

Linux counts several resources per host user, across every namespace: descriptors in flight
in SCM_RIGHTS messages, inotify instances, POSIX message-queue bytes, pipe buffer pages,
pending signals, processes. Workers that shared one account shared these counters, so one
episode could exhaust them for every other (a victim's session zygote could no longer hand
over sessions). Each worker now runs as a uid of its own, so each counter is its own.

The pool's range, in this order: the `uids` a backend is given; the environment variable
`TOOLGYM_SANDBOX_UIDS` ("200000-200999"); the subordinate range that `/etc/subuid` registers
for the account `toolgym-sandbox` (`scripts/sandbox_setup.sh` registers 200000-200999 there,
so that `useradd` never hands it to another account's containers); else 200000-200999. A uid
of the range is never used while it names an account or a group, lies in another account's
`/etc/subuid` or `/etc/subgid` range, or any process on this machine runs as it.

A uid is held by an exclusive `flock` on a file of its own in a root-only folder
(`/run/toolgym/identities`), taken before the worker starts and dropped when it is gone; a
host process that crashes drops its locks with it. Before a uid is handed out, /proc is
scanned: a uid that any process still runs as (a dying worker's last processes, a container
whose owner crashed) is skipped. Only root, or a docker daemon, can run workers as other
uids: a non-root host's process-backend workers all run as its own uid (see `process.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import os
import pwd
import tempfile
import threading
from pathlib import Path

from toolgym.sandbox.host_user import HostUser
from toolgym.sandbox.remote import SandboxError

DEFAULT_UIDS = range(200_000, 201_000)
ENV_VAR = "TOOLGYM_SANDBOX_UIDS"
ACCOUNT = "toolgym-sandbox"
"""The account whose `/etc/subuid` range is the pool, where one is registered."""


class PoolExhausted(SandboxError):
    """Every uid of the pool is held by a live worker (or cannot be used)."""


class Identity:
    """A host uid (and the gid of the same number) held for one worker; `release` when the
    worker is gone (idempotent)."""

    def __init__(self, uid: int, lock: int) -> None:
        self.uid = self.gid = uid
        self.user = HostUser(f"pool uid {uid}", uid, uid)
        self._lock: int | None = lock

    def release(self) -> None:
        """Drop the uid's lock: the pool may hand it out again (once no process runs as
        it)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            with contextlib.suppress(OSError):
                os.close(lock)  # drops the flock

    @property
    def held(self) -> bool:
        """Whether this worker still holds the uid."""
        return self._lock is not None

    def __repr__(self) -> str:
        return f"Identity(uid={self.uid}, held={self.held})"


def pool_range(uids: range | None = None) -> range:
    """The pool's uids (see the module's doc for the order in which it is chosen)."""
    if uids is not None:
        return _checked(uids, "uids")
    text = os.environ.get(ENV_VAR, "").strip()
    if text:
        first, sep, last = text.partition("-")
        if not (sep and first.strip().isdigit() and last.strip().isdigit()):
            raise ValueError(f"{ENV_VAR}={text!r}: expected FIRST-LAST, e.g. 200000-200999")
        return _checked(range(int(first), int(last) + 1), ENV_VAR)
    registered = _subordinate_ranges("/etc/subuid").get(ACCOUNT)
    if registered:
        return _checked(registered[0], f"/etc/subuid ({ACCOUNT})")
    return DEFAULT_UIDS


def _checked(uids: range, where: str) -> range:
    if not isinstance(uids, range) or uids.step != 1 or len(uids) == 0:
        raise ValueError(f"{where}: a non-empty range of uids with step 1, not {uids!r}")
    if uids.start < 1000 or uids.stop > 2**32 - 2:
        raise ValueError(f"{where}: uids from 1000 to 4294967293, not {uids.start}-{uids.stop - 1}")
    return uids


class _Pool:
    """The uids of one range, handed out in turn (never the one just returned: a dying
    worker's processes may still exit)."""

    def __init__(self, uids: range) -> None:
        self.uids = uids
        self._next = 0
        self._lock = threading.Lock()
        self.excluded = _excluded(uids)

    def acquire(self) -> Identity:
        folder = lock_folder()
        with self._lock:
            running: set[int] | None = None
            for step in range(len(self.uids)):
                uid = self.uids[(self._next + step) % len(self.uids)]
                if uid in self.excluded:
                    continue
                lock = _try_lock(folder / str(uid))
                if lock is None:
                    continue  # another worker (of this process or another) holds it
                if running is None:
                    running = running_uids()  # after the lock: no holder starts one now
                if uid in running:
                    os.close(lock)
                    continue
                self._next = (self._next + step + 1) % len(self.uids)
                return Identity(uid, lock)
        usable = len(self.uids) - len(self.excluded & set(self.uids))
        raise PoolExhausted(
            f"all {usable} usable host uids of the sandbox pool ({self.uids.start}-"
            f"{self.uids.stop - 1}) are held by live workers or run processes: one per live "
            f"worker; give a larger range with ProcessBackend(uids=...) / DockerBackend(uids="
            f"...) or {ENV_VAR}=FIRST-LAST, or run fewer workers at once"
        )


@functools.cache
def _pool(uids: range) -> _Pool:
    return _Pool(uids)


def acquire(uids: range | None = None) -> Identity:
    """A uid of the pool that no live worker holds and no process runs as; raises
    `PoolExhausted` when there is none."""
    return _pool(pool_range(uids)).acquire()


def lock_folder() -> Path:
    """The folder of the lock files: root-only, made on first use (`/run/toolgym/identities`
    for root where /run is writable, else one in the temp folder named after this uid)."""
    uid = os.getuid()
    candidates = []
    if uid == 0 and os.access("/run", os.W_OK):
        candidates.append(Path("/run/toolgym/identities"))
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if uid != 0 and runtime:
        candidates.append(Path(runtime) / "toolgym-identities")
    candidates.append(Path(tempfile.gettempdir()) / f"toolgym-identities-{uid}")
    for folder in candidates:
        with contextlib.suppress(OSError):
            folder.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
            info = folder.lstat()
            if not os.path.isdir(folder) or folder.is_symlink():
                continue
            if info.st_uid != uid or info.st_mode & 0o077:
                continue  # someone else's folder, or one others may write: never trusted
            return folder
    raise PoolExhausted(f"no private folder for the sandbox's uid locks (tried {candidates})")


def _try_lock(path: Path) -> int | None:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    with contextlib.suppress(OSError):  # who holds it, for a person looking
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def running_uids() -> set[int]:
    """Every uid (real, effective, saved, filesystem) of every process this machine shows in
    /proc, zombies aside (an exited process waiting to be reaped holds none of the counters;
    a worker's parent-less processes wait for the host's init)."""
    uids: set[int] = set()
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status", "rb") as status:
                    data = status.read()
            except OSError:
                continue  # gone meanwhile
            if b"\nState:\tZ" in data:
                continue
            start = data.find(b"\nUid:")
            if start >= 0:
                end = data.find(b"\n", start + 1)
                uids.update(int(field) for field in data[start + 5 : end].split())
    return uids


def _excluded(uids: range) -> set[int]:
    """Uids of the range that must never be used: accounts, groups, and other accounts'
    subordinate ranges."""
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    taken |= {entry.gr_gid for entry in grp.getgrall()}
    for table in ("/etc/subuid", "/etc/subgid"):
        for owner, ranges in _subordinate_ranges(table).items():
            if owner != ACCOUNT:
                for other in ranges:
                    taken.update(range(max(other.start, uids.start), min(other.stop, uids.stop)))
    return {uid for uid in taken if uid in uids}


def _subordinate_ranges(table: str) -> dict[str, list[range]]:
    """`/etc/subuid`-style lines (`name:first:count`) by owner."""
    ranges: dict[str, list[range]] = {}
    try:
        lines = Path(table).read_text().splitlines()
    except OSError:
        return ranges
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            first, count = int(parts[1]), int(parts[2])
            ranges.setdefault(parts[0], []).append(range(first, first + count))
    return ranges


__all__ = ["DEFAULT_UIDS", "Identity", "PoolExhausted", "acquire", "pool_range"]
