"""Keep a worker's freed heap for its next batch instead of handing it back to the system.

glibc gives the top of the heap back (``sbrk``/``madvise``) once more than its trim
threshold is free there, and by default that threshold follows the history of the
process: it is twice the largest block ever freed with ``munmap``, and such blocks are
those over the *mmap* threshold, itself raised only by such frees. A worker whose
first large block is one 150 KB image therefore trims at 300 KB: each batch's 64 fresh
samples are freed after collate, the 9.6 MB they took goes back to the system, and the
next batch faults every page of it in again (about 2,200 faults and 5 ms of a worker's
CPU per batch, three quarters of its time). Whether a worker fell into this depended
on whether its first batch happened to be stacked on the heap.

So workers set both thresholds at start-up, as glibc's own dynamic rule would after a
32 MiB block (its ceiling): blocks under 32 MiB come from the heap, and up to twice the
largest batch seen of freed heap is kept for the next batch. The peak is unchanged (the
samples of a batch exist at once anyway); what stays mapped between batches is at most
about what the next batch takes again.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
MIN_TRIM = 64 << 20  # glibc's trim threshold after a block of MMAP_THRESHOLD is freed
MAX_TRIM = 1 << 30  # mallopt takes a C int


class HeapKeeper:
    """Sets the worker's malloc thresholds and raises the trim threshold with the
    batches (one comparison a batch). Does nothing where the C library has no
    ``mallopt`` (musl, macOS)."""

    def __init__(self, mallopt: Callable[[int, int], int] | None = None) -> None:
        self._mallopt = mallopt if mallopt is not None else _find_mallopt()
        self.trim = 0
        if self._mallopt is not None and self._mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
            self._set_trim(MIN_TRIM)

    def batch_made(self, nbytes: int) -> None:
        """A batch of ``nbytes`` was made: keep twice that much freed heap."""
        if 2 * nbytes > self.trim and self.trim:
            self._set_trim(min(MAX_TRIM, 1 << (2 * nbytes - 1).bit_length()))

    def _set_trim(self, nbytes: int) -> None:
        if (
            self._mallopt is not None
            and nbytes != self.trim
            and self._mallopt(_M_TRIM_THRESHOLD, nbytes)
        ):
            self.trim = nbytes


def _find_mallopt() -> Any:
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return None
    mallopt.restype = ctypes.c_int
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt
