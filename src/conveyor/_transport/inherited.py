"""Let go of the shared memory a forked worker inherits from other loaders.

A worker forked while another loader is running (a validation loader first iterated
mid-epoch) inherits that loader's memfds and its maps of their slots: for as long as
the worker lives, the kernel cannot free them, even after the other loader is gone.
So a forked worker, before anything else, lets go of every conveyor memfd but its own.

Neither the descriptor numbers nor the address ranges are given back: objects copied
from the parent may still close or unmap them one day (a garbage cycle collected in
the worker), and must not hit a descriptor or a map the worker made since. Each
descriptor is pointed at ``/dev/null`` instead, and each map is replaced by private
zero pages (nothing is committed until touched, and nothing in the worker touches them).
"""

from __future__ import annotations

import contextlib
import mmap
import os

from .arena import ARENA_PREFIX, SETUP_NAME
from .memfd import libc

_DEV_NULL = "/dev/null"
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MAP_FIXED = 0x10


def release_foreign_memory(*own_fds: int) -> int:
    """Drop every inherited conveyor memfd and map except those of ``own_fds`` (the
    arenas of this process's cores); return how many descriptors and maps were let go
    (for tests). Best effort: a failure leaves the memory held, which is what happened
    before."""
    own = {os.fstat(fd).st_ino for fd in own_fds}
    released = 0
    with contextlib.suppress(OSError):
        released += _release_maps(own)
    with contextlib.suppress(OSError):
        released += _release_descriptors(own)
    return released


def _is_ours(path: str) -> bool:
    name = path.removeprefix("/memfd:")
    return path.startswith("/memfd:") and (name.startswith((ARENA_PREFIX, SETUP_NAME)))


def _release_maps(own: set[int]) -> int:
    released = 0
    with open("/proc/self/maps") as maps:
        lines = maps.readlines()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not _is_ours(fields[5].strip()) or int(fields[4]) in own:
            continue
        start, end = (int(part, 16) for part in fields[0].split("-"))
        libc.mmap(
            start,
            end - start,
            mmap.PROT_READ | mmap.PROT_WRITE,
            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE,
            -1,
            0,
        )
        released += 1
    return released


def _release_descriptors(own: set[int]) -> int:
    released = 0
    null = os.open(_DEV_NULL, os.O_RDWR | os.O_CLOEXEC)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                if not _is_ours(os.readlink(f"/proc/self/fd/{fd}")):
                    continue
                if os.fstat(fd).st_ino in own:
                    continue
            except OSError:  # closed meanwhile (the listing's own descriptor)
                continue
            os.dup2(null, fd, inheritable=False)
            released += 1
    finally:
        os.close(null)
    return released
