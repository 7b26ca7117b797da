"""What a process-backend worker sees of the host: the read-only binds of its view, the import
path they make, and the host-wide counters hidden from it.

- System folders (`/usr`, `/lib`, ...) and harmless `/etc` files at their own paths.
- The interpreter (every hop of its symlink chain, its prefixes and the virtual environment's)
  at its own paths: a venv and its base interpreter find each other by absolute paths.
- toolgym at `/opt/toolgym/toolgym`, the environment's module file or package at
  `/opt/module/NAME`, each of `extra_paths` at `/opt/code/N`: fixed paths in the sandbox's
  read-only root, whatever folder the project lives in (the docker backend mounts the same).
- A bind whose path lies under a folder the sandbox may write (`/tmp`, `/dev/shm`: a project
  or venv cloned under /tmp) is placed inside a small read-only tmpfs mounted on its top
  folder there (`guards`): the sandbox can neither write beside it nor rename a folder of its
  path away (a mount point cannot be renamed).

The worker's import path is exactly `sys_path`: the fixed folders, then the interpreter's own
entries (site-packages, the standard library); `toolgym/sandbox/boot.py` sets it and checks
that the sandbox can write none of it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from toolgym.sandbox.imports import TOOLGYM_SOURCE, module_root

TOOLGYM_MOUNT = "/opt/toolgym"
MODULE_MOUNT = "/opt/module"
CODE_MOUNT = "/opt/code"
BOOT = f"{TOOLGYM_MOUNT}/toolgym/sandbox/boot.py"
"""The worker's first file, inside the sandbox."""
WRITABLE = ("/tmp", "/dev/shm")
"""The folders a worker may write (its private tmpfs mounts)."""

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = (
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/nsswitch.conf",
)
"""Files under /etc that programs read and that hold no secrets."""
HOSTS = Path(__file__).with_name("hosts")
"""The worker's /etc/hosts (localhost and its own name: not the host's names)."""

HIDDEN_PROC = (
    "vmstat",
    "diskstats",
    "schedstat",
    "interrupts",
    "softirqs",
    "zoneinfo",
    "buddyinfo",
    "pagetypeinfo",
    "locks",
    "cgroups",
    "key-users",
    "pressure/cpu",
    "pressure/memory",
    "pressure/io",
    "sys/fs/file-nr",
    "sys/fs/inode-nr",
    "sys/fs/dentry-state",
    "sys/fs/aio-nr",
    "sys/kernel/random/boot_id",
)
"""/proc files that count the whole host (other episodes' activity, a side channel), shown
empty in the worker."""


@dataclass(frozen=True)
class Bind:
    """`source` on the host, read-only at `dest` in the sandbox."""

    source: str
    dest: str
    system: bool = False
    """A system folder every account reaches (never staged; see `toolgym.sandbox.scratch`)."""


@dataclass
class View:
    binds: list[Bind] = field(default_factory=list)
    sys_path: list[str] = field(default_factory=list)


def worker_view(target: type | None, extra_paths: list[str]) -> View:
    """The binds and import path of a bubblewrap worker for `target`."""
    binds = [Bind(p, p, system=True) for p in (*SYSTEM, *ETC) if os.path.exists(p)]
    own = [str(hop.parent) for hop in symlink_chain(Path(sys.executable))]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        own += [str(Path(prefix).resolve()), prefix]
    own += interpreter_entries()
    own = [p for p in dict.fromkeys(own) if os.path.exists(p)]
    binds += [Bind(p, p) for p in outermost(own)]
    sys_path = []
    for index, folder in enumerate(p for p in extra_paths if os.path.exists(p)):
        binds.append(Bind(str(Path(folder).resolve()), f"{CODE_MOUNT}/{index}"))
        sys_path.append(f"{CODE_MOUNT}/{index}")
    module = module_root(target)
    if module is not None:
        binds.append(Bind(str(module), f"{MODULE_MOUNT}/{module.name}"))
        sys_path.append(MODULE_MOUNT)
    binds.append(Bind(str(TOOLGYM_SOURCE), f"{TOOLGYM_MOUNT}/toolgym"))
    sys_path.append(TOOLGYM_MOUNT)
    binds.append(Bind(str(HOSTS), "/etc/hosts"))
    return View(binds, [*sys_path, *interpreter_entries()])


def host_sys_path(target: type | None, extra_paths: list[str]) -> list[str]:
    """The import path of a worker without bubblewrap (the host's own folders)."""
    module = module_root(target)
    folders = [*extra_paths, *([str(module.parent)] if module is not None else [])]
    return list(dict.fromkeys([*folders, str(TOOLGYM_SOURCE.parent), *interpreter_entries()]))


def interpreter_entries() -> list[str]:
    """This process's import path entries that belong to the interpreter (standard library,
    site-packages), as written."""
    return [entry for entry in sys.path if entry and inside_interpreter(entry)]


def guards(binds: list[Bind]) -> list[str]:
    """The top folders under a writable folder (`WRITABLE`) that bind destinations pass
    through: each gets a read-only tmpfs of its own. Raises ValueError for a destination that
    is a writable folder itself."""
    tops = []
    for bind in binds:
        for writable in WRITABLE:
            if bind.dest == writable:
                raise ValueError(f"{bind.source} would be bound on {writable}, the sandbox's own")
            if bind.dest.startswith(writable + "/"):
                top = writable + "/" + bind.dest[len(writable) + 1 :].split("/")[0]
                tops.append(top)
    return list(dict.fromkeys(tops))


def proc_masks(memory_bytes: int, cpus: float) -> tuple[dict[str, bytes], list[str]]:
    """Host-wide /proc counters the worker reads instead: files with content of its own (load,
    uptime, memory as its limit, CPU time) and files shown empty; only those this kernel has."""
    count = max(1, int(cpus + 0.999)) if cpus > 0 else os.cpu_count() or 1
    kib = memory_bytes // 1024
    zeros = " ".join(["0"] * 10)
    stat = [f"cpu  {zeros}"] + [f"cpu{i} {zeros}" for i in range(count)]
    stat += ["intr 0", "ctxt 0", "btime 0", "processes 1", "procs_running 1", "procs_blocked 0"]
    meminfo = [
        ("MemTotal", kib),
        ("MemFree", kib),
        ("MemAvailable", kib),
        ("Buffers", 0),
        ("Cached", 0),
        ("SwapCached", 0),
        ("Active", 0),
        ("Inactive", 0),
        ("SwapTotal", 0),
        ("SwapFree", 0),
        ("Shmem", 0),
    ]
    content = {
        "loadavg": "0.00 0.00 0.00 1/1 1\n",
        "uptime": "0.00 0.00\n",
        "stat": "\n".join(stat) + "\n",
        "meminfo": "".join(f"{name + ':':<16}{value:>8} kB\n" for name, value in meminfo),
    }
    shown = {f"/proc/{name}": text.encode() for name, text in content.items()}
    hidden = [f"/proc/{name}" for name in HIDDEN_PROC]
    return (
        {path: data for path, data in shown.items() if os.path.exists(path)},
        [path for path in hidden if os.path.exists(path)],
    )


def symlink_chain(path: Path) -> list[Path]:
    """`path` and every path its symlinks lead through (a venv's python -> a tool's python ->
    the real interpreter)."""
    chain = [path]
    while chain[-1].is_symlink() and len(chain) < 40:
        target = Path(os.readlink(chain[-1]))
        chain.append(target if target.is_absolute() else chain[-1].parent / target)
    return chain


def inside_interpreter(path: str) -> bool:
    """Whether a sys.path entry belongs to the interpreter (stdlib, site-packages)."""
    resolved = str(Path(path).resolve())
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return any(
        resolved.startswith(str(Path(p).resolve()) + os.sep) or resolved == p for p in prefixes
    )


def outermost(paths: list[str]) -> list[str]:
    """Drop paths inside another one of the list (binding the outer one covers them)."""
    ordered = sorted(paths, key=len)
    kept: list[str] = []
    for path in ordered:
        if not any(path == k or path.startswith(k.rstrip(os.sep) + os.sep) for k in kept):
            kept.append(path)
    return kept
