"""A sandbox worker's /tmp, carried by its snapshot and put back by a restore.

Where a worker's /tmp is its sandbox's own (bubblewrap's tmpfs, a container's; the backend
says so with `TOOLGYM_PRIVATE_TMP=1`, and /tmp must be a mount point), `pack` archives it and
`replace` puts an archive back in place of what /tmp holds, so that a fork starts with its
source's files and a restore goes back to the snapshot's. The files are the model's: they are
unpacked here, inside the sandbox, and never by the host.

What travels: folders (with their permission bits), regular files (permission bits only: no
owners, devices or set-id bits) and symbolic links that point downward (relative, no `..`:
however they chain, they stay below /tmp). Links that point elsewhere, hard links, FIFOs and
sockets are left out, and so is what is not /tmp's own: the working folders of the worker's
live code sessions (a session's image carries its files), and anything mounted there (the
read-only view of a project or venv under the host's /tmp).

Guards, since clearing a /tmp that is not the sandbox's would delete the host's files: the
backend's word and a mount point (`private_tmp`), and no entry owned by another user. Files
are created with `O_EXCL | O_NOFOLLOW`, and the code's sessions are frozen while a worker
serves a request, so nothing swaps a folder for a link meanwhile. A failed `replace` puts
/tmp back as it was.

Standard library only (it runs in a minimal container image).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator

from toolgym.envs.snapshots import NotForkable

_held: set[str] = set()
"""Folders holding /tmp's entries while `replace` runs (not /tmp's own)."""


def private_tmp() -> bool:
    """Whether this worker's /tmp is its sandbox's own: its backend says so, and it is a
    mount point. Never the host's /tmp, which a restore would otherwise clear."""
    folder = tempfile.gettempdir()
    return os.environ.get("TOOLGYM_PRIVATE_TMP") == "1" and os.path.ismount(folder)


def pack(limit: int) -> bytes:
    """/tmp's own entries as a tar archive; `NotForkable` past `limit` bytes (counted before
    a file is read: a sparse file costs its size) or for what cannot be read."""
    folder, buffer, total = tempfile.gettempdir(), io.BytesIO(), 0
    try:
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for path in _paths(folder):
                status = os.lstat(path)
                total += status.st_size if stat.S_ISREG(status.st_mode) else 512
                if total > limit:
                    raise NotForkable(f"the files in /tmp are over the {limit:,} bytes left")
                archive.add(path, arcname=os.path.relpath(path, folder), recursive=False)
    except OSError as error:  # a file or folder the code made unreadable
        raise NotForkable(f"/tmp cannot be copied: {error}") from None
    return buffer.getvalue()


def replace(data: bytes, then: Callable[[], None]) -> None:
    """/tmp's own entries replaced by `data`'s (a `pack`), then `then()` (the environment's
    restore); if either fails, /tmp is put back as it was and the error raised."""
    if not private_tmp():
        raise NotForkable(
            "the snapshot carries a sandbox's /tmp, and this worker's /tmp is not its own: "
            "restore it into a sandbox with a /tmp of its own"
        )
    folder = tempfile.gettempdir()
    entries = _entries()
    foreign = [path for path in entries if os.lstat(path).st_uid != os.getuid()]
    if foreign:  # a second guard: a sandbox's own /tmp holds only its worker's files
        raise NotForkable(f"/tmp holds files of other users ({foreign[0]}, ...): not replaced")
    hold = tempfile.mkdtemp(prefix=".toolgym-held-", dir=folder)
    _held.add(hold)
    try:
        try:
            for path in entries:
                _own(path)  # a folder moves only if it is writable
                os.rename(path, os.path.join(hold, os.path.basename(path)))
            _unpack(data, folder)
        except (OSError, RecursionError, tarfile.TarError) as error:
            _put_back(hold, folder)
            raise NotForkable(f"/tmp could not be replaced: {error}") from None
        try:
            then()
        except BaseException:
            _put_back(hold, folder)
            raise
    finally:
        _remove(hold)
        _held.discard(hold)


def _put_back(hold: str, folder: str) -> None:
    """What `replace` unpacked goes; what it held comes back."""
    for path in _entries():
        _remove(path)
    for name in os.listdir(hold):
        os.rename(os.path.join(hold, name), os.path.join(folder, name))


def _entries() -> list[str]:
    """The paths of /tmp's own entries (see the module docstring)."""
    from toolgym.sandbox.python_session import live_folders

    folder = tempfile.gettempdir()
    device, skipped = os.lstat(folder).st_dev, live_folders() | _held
    paths = [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
    return [path for path in paths if path not in skipped and os.lstat(path).st_dev == device]


def _paths(folder: str) -> Iterator[str]:
    """Every path under /tmp's own entries, folders before what they hold, on /tmp's file
    system only; an unreadable folder raises."""
    device = os.lstat(folder).st_dev

    def unreadable(error: OSError) -> None:
        raise error

    for top in _entries():
        yield top
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            continue
        for root, folders, files in os.walk(top, onerror=unreadable):
            folders[:] = [f for f in folders if os.lstat(os.path.join(root, f)).st_dev == device]
            for name in sorted(folders) + sorted(files):
                yield os.path.join(root, name)


def _own(path: str) -> None:
    """Make a real folder (not a link) writable and searchable by its owner, this worker."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        os.chmod(path, 0o700)


def _remove(path: str) -> None:
    """Remove `path`, folders the code made unreadable or read-only included."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        _own(path)
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def _unpack(data: bytes, folder: str) -> None:
    """A `pack`'s entries into `folder` (see the module docstring), written out rather than
    tarfile's data filter, which Python before 3.11.4 (a worker image's) lacks."""
    taken = set(os.listdir(folder))  # mounts, live sessions' folders: not ours to fill
    links, modes = [], []
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive:
            name = member.name
            if name != os.path.normpath(name) or name.startswith(("/", "..")) or name == ".":
                continue
            if name.split("/")[0] in taken:
                continue
            path = os.path.join(folder, name)
            if member.issym():
                links.append((path, member.linkname))
            elif member.isdir():
                os.makedirs(path, exist_ok=True)
                modes.append((path, member.mode & 0o777))
            elif member.isfile():
                os.makedirs(os.path.dirname(path), exist_ok=True)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                source = archive.extractfile(member)
                assert source is not None  # a regular file's
                with source, os.fdopen(os.open(path, flags, 0o600), "wb") as target:
                    while chunk := source.read(1 << 20):
                        target.write(chunk)
                    os.fchmod(target.fileno(), member.mode & 0o777)
    for path, pointed in links:  # after every file: no file is written through a link
        downward = not os.path.isabs(pointed) and ".." not in pointed.split("/")
        if downward and not os.path.lexists(path):
            os.symlink(pointed, path)
    for path, mode in sorted(modes, key=lambda each: -each[0].count("/")):  # deepest first
        os.chmod(path, mode)
