"""A process-backend worker's writable folders, `/tmp` and `/dev/shm`, as tmpfs mounts with a
size and an inode cap.

bubblewrap's own `--tmpfs` takes a size but no inode count, and every empty file costs kernel
memory the size does not count (808,000 empty files held about 1 GiB). When this process is
root, the worker's child makes a mount namespace of its own between fork and exec (`mount`),
mounts two tmpfs with `size=` and `nr_inodes=` on the empty folders of a host folder made for
the worker, and bubblewrap binds them in. The mounts exist only in that namespace and vanish
with the worker; the host sees two empty folders, removed with the worker (`remove`), or by
`remove_stale` if the host process died first.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from pathlib import Path

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
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

    def mount(self) -> None:
        """In the calling process (the child, before exec): a private mount namespace with
        the two tmpfs mounted. Raises OSError when the kernel refuses."""
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        options = f"size={self.size_bytes},nr_inodes={self.inodes},mode=1777".encode()
        for folder in (self.tmp, self.shm):
            flags = _MS_NOSUID | _MS_NODEV
            _check(_libc.mount(b"tmpfs", bytes(folder), b"tmpfs", flags, options), "mount tmpfs")

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
