"""A process-backend worker's private mounts, made by a root host before bubblewrap starts:
its writable folders, `/tmp` and `/dev/shm`, as tmpfs mounts with a size and an inode cap,
and the staged folders of its read-only view.

bubblewrap's own `--tmpfs` takes a size but no inode count, and every empty file costs kernel
memory the size does not count (808,000 empty files held about 1 GiB). When this process is
root, the worker's child makes a mount namespace of its own between fork and exec (`mount`),
mounts two tmpfs with `size=` and `nr_inodes=` on the empty folders of a host folder made for
the worker, and bubblewrap binds them in.

Staging: bubblewrap runs as the worker's unprivileged host uid, and binds a folder only if
that uid can reach it; a project, virtual environment or interpreter under a private folder
(a home folder of mode 700, `/root`) is not reachable. So the child, still root, also binds
each folder of the view (`stage`) onto an empty mount point of the worker's host folder, and
bubblewrap binds it from there: no folder above it needs opening to other accounts, and the
files stay private to every account but the sandbox's (which reads them by their own
permission bits, as any other account would if it could reach them).

The mounts exist only in that namespace and vanish with the worker; the host sees empty
folders and files, removed with the worker (`remove`), or by `remove_stale` if the host
process died first.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from pathlib import Path

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
_PREFIX = "toolgym-scratch-"
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: nothing to load in the child


class Scratch:
    """The host folder of one worker's `/tmp` and `/dev/shm` mounts.

    Args:
        size_bytes: Size of each tmpfs.
        inodes: Files and folders each tmpfs may hold.
    """

    def __init__(self, size_bytes: int, inodes: int) -> None:
        self.size_bytes, self.inodes = size_bytes, inodes
        self.folder = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        self.folder.chmod(0o755)  # the worker's user enters it to reach the mounts
        self.tmp, self.shm = self.folder / "tmp", self.folder / "shm"
        self.tmp.mkdir()
        self.shm.mkdir()
        self.view = self.folder / "view"
        self.view.mkdir()
        self.staged: dict[str, Path] = {}
        """Host path -> its mount point here."""

    def stage(self, source: str) -> str:
        """Where bubblewrap finds `source` once `mount` has run: an empty folder (or file) of
        this scratch folder that `source` is bound on."""
        point = self.staged.get(source)
        if point is None:
            point = self.view / str(len(self.staged))
            if os.path.isdir(source):
                point.mkdir()
            else:
                point.touch(mode=0o644)
            self.staged[source] = point
        return str(point)

    def mount(self) -> None:
        """In the calling process (the child, before exec): a private mount namespace with
        the two tmpfs mounted and the staged folders bound. Raises OSError when the kernel
        refuses."""
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        options = f"size={self.size_bytes},nr_inodes={self.inodes},mode=1777".encode()
        for folder in (self.tmp, self.shm):
            flags = _MS_NOSUID | _MS_NODEV
            _check(_libc.mount(b"tmpfs", bytes(folder), b"tmpfs", flags, options), "mount tmpfs")
        for source, point in self.staged.items():
            bound = _libc.mount(source.encode(), bytes(point), None, _MS_BIND | _MS_REC, None)
            _check(bound, f"bind {source}")

    def remove(self) -> None:
        """Remove the host folder (empty on the host: the mounts were the worker's)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def remove_stale() -> None:
    """Remove scratch folders of host processes that died without removing them."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        pid = folder.name[len(_PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)
