"""A worker's first code: the import path the host chose, checked before anything is imported.

Backends start the worker as `python -I -S -B -u .../toolgym/sandbox/boot.py`: no `site`
(no `.pth` files, no user site, no working folder), no `PYTHON*` variables. The import path
is `TOOLGYM_SYS_PATH` (the folders the host bound read-only: toolgym at `/opt/toolgym`, the
environment's module at `/opt/module`, `extra_paths` / `code_paths` at `/opt/code/N`, the
interpreter's site-packages), then the interpreter's own standard library. With
`TOOLGYM_CHECK_SYS_PATH=1` (every bubblewrap or docker worker) the worker refuses to start,
saying why on stderr (which the host reports), when code running in the sandbox could put a
module on that path: an entry it can write, a missing entry under a folder it can write, or
an entry whose path passes through a folder it can write (it could rename the folder away
and make a new one) other than at a mount point (which cannot be renamed) or where a sticky
bit forbids it.

Standard library only; imports nothing from toolgym until the path is checked.
"""

from __future__ import annotations

import os
import sys

REFUSED_EXIT_CODE = 78
"""The worker's exit code when it refuses to start (EX_CONFIG)."""


def main() -> None:
    """Set the import path from `TOOLGYM_SYS_PATH`, check it (`TOOLGYM_CHECK_SYS_PATH=1`),
    then serve as the worker."""
    chosen = [entry for entry in os.environ.get("TOOLGYM_SYS_PATH", "").split(os.pathsep) if entry]
    sys.path[:] = list(dict.fromkeys([*chosen, *(entry for entry in sys.path if entry)]))
    if os.environ.get("TOOLGYM_CHECK_SYS_PATH") == "1":
        problem = unsafe_entry(sys.path)
        if problem is not None:
            sys.stderr.write(f"toolgym worker refused to start: {problem}\n")
            sys.stderr.flush()
            os._exit(REFUSED_EXIT_CODE)
    from toolgym.sandbox.worker import main as serve

    serve()


def unsafe_entry(entries: list[str]) -> str | None:
    """Why code running as this process could plant a module on `entries`, for the first
    entry where it could; None when it cannot for any."""
    mounts = mount_points()
    for entry in entries:
        why = _why_unsafe(entry, mounts)
        if why is not None:
            return f"the import path entry {entry} {why}"
    return None


def _why_unsafe(entry: str, mounts: set[str]) -> str | None:
    path = os.path.abspath(entry)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if os.access(existing, os.W_OK):
        if existing == path:
            return "is writable by the sandbox"
        return f"is missing and {existing}, where it would be made, is writable by the sandbox"
    for chain in (existing, os.path.realpath(existing)):
        hop = chain
        while hop != "/":
            parent = os.path.dirname(hop)
            if hop not in mounts and os.access(parent, os.W_OK) and not _sticky(parent, hop):
                return (
                    f"passes through {hop}, which the sandbox could replace ({parent} is "
                    "writable and it is no mount point)"
                )
            hop = parent
    return None


def _sticky(parent: str, hop: str) -> bool:
    """Whether `parent`'s sticky bit keeps this process from renaming `hop` (it owns
    neither)."""
    try:
        folder, entry = os.stat(parent), os.lstat(hop)
    except OSError:
        return False
    me = os.geteuid()
    return bool(folder.st_mode & 0o1000) and me not in (folder.st_uid, entry.st_uid)


def mount_points() -> set[str]:
    """The mount points this process sees (`/proc/self/mountinfo`, escapes decoded)."""
    points = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
            for line in info:
                fields = line.split()
                if len(fields) > 4:
                    points.add(_unescape(fields[4]))
    except OSError:
        pass
    return points


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (`\\040`)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


if __name__ == "__main__":
    main()
