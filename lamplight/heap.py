"""glibc's heap, where lamplight decides how freed memory is kept: the one place that calls its
mallopt and malloc_trim (a no-op, returning False, on a C library without them).

Freed blocks stay in glibc's arenas (one per thread that allocated) until they are reused or
trimmed; a server's resident memory then stays at its busiest step's. The engine gives them back
once it has been idle a moment (release_freed_memory); an encoder, whose steps allocate tens of
MiB each, keeps them instead (keep_freed_buffers), as llama.cpp keeps its compute buffer.
"""

from __future__ import annotations

import ctypes
import functools

# glibc's mallopt parameters, and the size up to which an encoder's freed blocks stay in the heap.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 256 << 20


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


@functools.cache
def keep_freed_buffers() -> bool:
    """A step's tensors are tens of MiB (a 4096-token encoder step's FFN rows: 48 MiB), and glibc
    maps every block over its mmap threshold afresh and unmaps it when freed, so each is paged in
    and zeroed again: 1.4M page faults, a quarter of the time of a 64-document rerank. Kept in the
    heap (the process holds its largest step's working set, as llama.cpp holds its compute
    buffer), they are reused: 3 faults. Process-wide and once; False where mallopt is missing."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * KEEP_FREED_BYTES))


def release_freed_memory() -> bool:
    """malloc_trim(0): the free pages of every arena go back to the system (SmolLM2 serving 16
    streams: 47 MiB of 585). Takes milliseconds; False where the C library has no malloc_trim."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
