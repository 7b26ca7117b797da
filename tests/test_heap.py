"""Freed heap memory goes back to the system where glibc is the allocator."""

from __future__ import annotations

import platform

import pytest

from toolgym.algorithms.heap import return_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim only")
def test_glibc_trims_the_heap():
    assert return_freed_memory() is True
