"""The host account a process-backend worker runs as when toolgym runs as root.

bubblewrap started by root maps the worker's uid 65534 to the host's root: code in the worker
could then write whatever root may write and the namespaces do not hide (kernel settings
under `/proc/sys`, root's keyring). So a root host drops each worker to an unprivileged host
identity between fork and exec, before bubblewrap starts (`become`): by default a uid of its
own from a pool (`toolgym.sandbox.identities`), or one named account for every worker
(`ProcessBackend(user=...)`). The worker must be able to read what its view binds (the
interpreter, the virtual environment, toolgym, the environment's module): a root host that can
mount stages those folders so that no folder above them needs opening
(`toolgym.sandbox.scratch`), and `unreachable` names the first one the identity still cannot
read.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_USERS = ("toolgym-sandbox", "nobody")
"""Tried in order when no user is named."""


@dataclass(frozen=True)
class HostUser:
    """An unprivileged host account."""

    name: str
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid})"


def sandbox_user(name: str | None = None) -> HostUser | None:
    """The account named `name`, or the first of `DEFAULT_USERS` that exists; None if there
    is none (or `name` is root)."""
    for candidate in (name,) if name else DEFAULT_USERS:
        try:
            entry = pwd.getpwnam(candidate)
        except KeyError:
            continue
        if entry.pw_uid == 0:
            return None
        return HostUser(candidate, entry.pw_uid, entry.pw_gid)
    return None


def unreachable(paths: list[str], user: HostUser, ancestors: bool = True) -> str | None:
    """The first of `paths` that `user` cannot read (a folder it cannot list and enter, a
    file it cannot read, or with `ancestors` a parent it cannot enter), with why; None when
    all are readable. Permission bits only (no ACLs), the user's own group only (workers run
    with no supplementary groups)."""
    for path in paths:
        target = Path(path).resolve()
        for hop in [*reversed(target.parents), target] if ancestors else [target]:
            try:
                info = os.stat(hop)
            except OSError as error:
                return f"{hop}: {error.strerror}"
            needed = 0o5 if stat.S_ISDIR(info.st_mode) and hop == target else 0o4
            if stat.S_ISDIR(info.st_mode) and hop != target:
                needed = 0o1
            if not _allowed(info, user, needed):
                return f"{hop} (mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid})"
    return None


def _allowed(info: os.stat_result, user: HostUser, needed: int) -> bool:
    if info.st_uid == user.uid:
        bits = info.st_mode >> 6
    elif info.st_gid == user.gid:
        bits = info.st_mode >> 3
    else:
        bits = info.st_mode
    return bits & needed == needed


def become(user: HostUser) -> None:
    """Drop to `user` for good: no supplementary groups, its group, its uid (real, effective
    and saved). Runs in the child between fork and exec."""
    os.setgroups([])
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)
