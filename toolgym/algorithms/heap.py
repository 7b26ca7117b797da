"""Handing the memory a training stage freed back to the operating system.

glibc's allocator keeps freed memory in its heaps for reuse. An update frees its activations,
gradients and logits chunks at the end (about 2 GB for SmolLM2-135M in micro-batches of 4),
and the process's resident set stays that large while the next stage runs beside it: vLLM's
engine in the same process, the evaluation, the next rollouts. Measured on the flagship, the
resident set after an update fell from 4.4 to 2.4 GB with `malloc_trim(0)`, at no cost in step
time. `return_freed_memory` does that where glibc is the allocator and nothing elsewhere.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the system; whether glibc's `malloc_trim` ran."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
