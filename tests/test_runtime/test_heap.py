"""Freed heap memory goes back to the system where glibc is the allocator."""

from __future__ import annotations

import platform

import pytest

from toolgym.runtime.heap import return_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim only")
def test_glibc_trims_the_heap():
    assert return_freed_memory() is True


MAPPED_AFTER_A_LARGE_FREE = """
import ctypes, sys
from toolgym.runtime.heap import map_large_allocations

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "fixed":
    assert map_large_allocations(4 << 20)
libc.free(libc.malloc(24 << 20))  # glibc raises its own threshold past 24 MiB here
before = libc.mallinfo2().hblks
block = libc.malloc(6 << 20)
print(libc.mallinfo2().hblks - before)  # 1: the block has its own mapping
libc.free(block)
"""


def glibc_at_least(major: int, minor: int) -> bool:
    name, version = platform.libc_ver()
    return name == "glibc" and tuple(map(int, version.split(".")[:2])) >= (major, minor)


@pytest.mark.skipif(not glibc_at_least(2, 33), reason="glibc's mallopt and mallinfo2 only")
@pytest.mark.parametrize(("threshold", "mapped"), [("glibc's", "0"), ("fixed", "1")])
def test_a_fixed_threshold_maps_large_blocks_after_a_larger_free(threshold, mapped):
    """glibc serves 6 MiB from its heap once a 24 MiB block was freed; a fixed 4 MiB
    threshold keeps mapping it (in a fresh process: the setting is process-wide)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", MAPPED_AFTER_A_LARGE_FREE, threshold],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == mapped
