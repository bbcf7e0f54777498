"""The system calls under the shared-memory arena: a range of a memfd mapped without a
descriptor of its own, its pages given back (a hole punched), the address-space limit
that a failed map is explained by."""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import resource
import weakref

import numpy as np

from ..errors import SharedMemoryExhaustedError

__all__ = ["PAGE", "address_space_limited", "libc", "map_range", "punch_hole", "round_up"]

PAGE = mmap.PAGESIZE


def round_up(n: int, to: int = PAGE) -> int:
    return (n + to - 1) // to * to


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def punch_hole(fd: int, offset: int, size: int) -> None:
    """Free the pages of a memfd range (the file keeps its size; the range reads zeros)."""
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    if libc.fallocate(fd, mode, offset, size) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"giving back {size} bytes of shared memory: {os.strerror(error)}")


def address_space_limited() -> bool:
    """Whether this process runs under an address-space limit (``ulimit -v``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return soft != resource.RLIM_INFINITY


def _address_space_error(size: int, where: str, exc: OSError) -> SharedMemoryExhaustedError:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        limit = "The address space is not limited (ulimit -v unlimited), so the kernel refused"
    else:
        limit = (
            f"The address space of each process is limited to {soft / 2**20:,.0f} MiB "
            f"(ulimit -v) and {_address_space_used() / 2**20:,.0f} MiB of it is in use"
        )
    return SharedMemoryExhaustedError(
        f"Could not map {size / 2**20:.1f} MiB of shared memory for a batch in {where}: "
        f"{exc.strerror}. {limit}. Fix: raise the limit (ulimit -v), or lower batch_size, "
        "prefetch_factor or num_workers, or keep fewer batches alive at once."
    )


def _address_space_used() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def map_range(fd: int, offset: int, size: int, where: str) -> np.ndarray:
    """Map ``size`` bytes of ``fd`` from ``offset`` without keeping a descriptor for it.

    ``mmap.mmap`` keeps a duplicate of the fd for each map (before Python 3.13's
    ``trackfd``): with 96 workers and many held batches that ran into ``ulimit -n``
    mid-epoch. The mapping is made with libc instead and unmapped when the last
    array over it is garbage collected.
    """
    address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, offset)
    if address is None or address == _MAP_FAILED:
        error = ctypes.get_errno()
        exc = OSError(error, os.strerror(error))
        if error == errno.ENOMEM:
            raise _address_space_error(size, where, exc)
        raise OSError(error, f"mapping {size} bytes of shared memory: {os.strerror(error)}")
    region = (ctypes.c_uint8 * size).from_address(address)
    _unmaps.watch(region, address, size)
    return np.frombuffer(memoryview(region).cast("B"), dtype=np.uint8)


class _Unmaps:
    """Unmap a region when the last array over it dies. That may be in the user's code
    (a batch's last view dropped), and a Ctrl-C arriving then would be raised inside a
    callback written in Python, where Python prints it as ignored: the interrupt lost,
    and the region never unmapped. So the callback is C alone: ``munmap`` itself, through
    a prototype that also takes the weak reference a callback is given (in a register
    that ``munmap`` never reads, under every C calling convention Linux has)."""

    _PRUNE_FROM = 256  # references kept before the spent ones are looked for

    def __init__(self) -> None:
        self._munmap = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.py_object
        )(("munmap", libc))
        # Each reference is kept until it has run (one that dies first never calls
        # back), by address: an address is mapped again only once unmapped, so a new
        # region's reference replaces a spent one.
        self._refs: dict[int, weakref.ref[object]] = {}
        self._prune_at = self._PRUNE_FROM

    def watch(self, region: object, address: int, size: int) -> None:
        refs = self._refs
        if len(refs) >= self._prune_at:
            for spent in [key for key, ref in refs.items() if ref() is None]:
                del refs[spent]
            self._prune_at = max(self._PRUNE_FROM, 2 * len(refs))
        refs[address] = weakref.ref(region, functools.partial(self._munmap, address, size))


libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64,
]  # fmt: skip
libc.fallocate.restype = ctypes.c_int
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
libc.munmap.restype = ctypes.c_int
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_unmaps = _Unmaps()
_MAP_FAILED = ctypes.c_void_p(-1).value
