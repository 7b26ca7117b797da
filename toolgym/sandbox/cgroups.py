"""A control group per process-backend worker: a cap on its tasks (threads count), CPU and
memory.

The seccomp filter stops new processes but not threads, and RLIMIT_NPROC does not bind a
worker whose user namespace maps to root: without a pids cgroup a thread bomb in the model's
code could take every PID of the host. Where this process may create cgroups (root, cgroup v1
`pids` / `cpu` hierarchies, or v2 with those controllers delegated), each worker joins its own
group between fork and exec; the group is removed when the worker is gone. Elsewhere nothing
is enforced and `isolation.notes` says so.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "toolgym"


class WorkerGroup:
    """One worker's cgroup(s). `join()` runs in the child before exec; `remove()` after it."""

    def __init__(self, max_tasks: int, cpus: float, memory_bytes: int = 0) -> None:
        self.folders: list[Path] = []
        self.enforced: dict[str, float] = {}
        name = f"worker-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        unified = _v2_root()
        if unified is not None:
            self._create(unified / PARENT / name, max_tasks, cpus, v2=True)
            if memory_bytes and "tasks" in self.enforced:
                self._limit_memory(unified / PARENT / name, memory_bytes, v2=True)
        else:
            if (ROOT / "pids" / "cgroup.procs").exists():
                self._create(ROOT / "pids" / PARENT / name, max_tasks, None, v2=False)
            if (ROOT / "cpu" / "cgroup.procs").exists():
                self._create(ROOT / "cpu" / PARENT / name, None, cpus, v2=False)
            if memory_bytes and (ROOT / "memory" / "cgroup.procs").exists():
                folder = ROOT / "memory" / PARENT / name
                with contextlib.suppress(OSError):
                    folder.mkdir(parents=True, exist_ok=True)
                    self.folders.append(folder)
                    self._limit_memory(folder, memory_bytes, v2=False)

    def join(self) -> None:
        """Move the calling process into the group(s) (between fork and exec)."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self, wait: float = 1.0) -> None:
        """Remove the group(s), waiting up to `wait` seconds for the worker's last tasks to
        finish exiting (the kernel refuses to remove a group that holds any); a group still
        busy then is left to `remove_stale`."""
        deadline = time.monotonic() + wait
        for folder in self.folders:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.005)
        self.folders = []

    def _limit_memory(self, folder: Path, memory_bytes: int, v2: bool) -> None:
        """Memory and memory + swap to `memory_bytes` (no swap beyond it); a failure leaves
        `memory_bytes` out of `enforced`."""
        try:
            if v2:
                (folder / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(FileNotFoundError):  # no swap controller: no swap
                    (folder / "memory.swap.max").write_text("0")
            else:
                (folder / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(FileNotFoundError):  # swap accounting is off
                    (folder / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        except OSError:
            return
        self.enforced["total_memory_bytes"] = memory_bytes

    def _create(self, folder: Path, tasks: int | None, cpus: float | None, v2: bool) -> None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if tasks is not None:
                (folder / "pids.max").write_text(str(tasks))
                self.enforced["tasks"] = tasks
            if cpus is not None and cpus > 0:
                period = 100_000
                quota = int(cpus * period)
                if v2:
                    (folder / "cpu.max").write_text(f"{quota} {period}")
                else:
                    (folder / "cpu.cfs_period_us").write_text(str(period))
                    (folder / "cpu.cfs_quota_us").write_text(str(quota))
                self.enforced["cpus"] = cpus
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()
            return
        self.folders.append(folder)


def _v2_root() -> Path | None:
    """The cgroup v2 folder where pids and cpu can be set for children, if any."""
    controllers = ROOT / "cgroup.controllers"
    if not controllers.exists():
        return None
    available = set(controllers.read_text().split())
    if not {"pids", "cpu"} <= available:
        return None
    parent = ROOT / PARENT
    try:
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+pids +cpu")
        if "memory" in available:
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        return None
    return ROOT


def remove_stale() -> None:
    """Remove empty worker groups left by processes that died without cleaning up."""
    for hierarchy in (ROOT, ROOT / "pids", ROOT / "cpu", ROOT / "memory"):
        parent = hierarchy / PARENT
        if parent.is_dir():
            for folder in parent.glob("worker-*"):
                pid = folder.name.split("-")[1]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    with contextlib.suppress(OSError):
                        folder.rmdir()
