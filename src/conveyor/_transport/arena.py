"""Shared memory for batches: one anonymous memfd per worker, cut into slots.

The main process creates the memfd (so it outlives a dead worker, and no name
exists that could be left behind: the kernel frees it when the last process
holding it exits, even after SIGKILL). The worker grows the file and carves
page-aligned *slots* out of it; a slot holds one batch and is reused once the
main process says every array of that batch has been garbage collected.

A slot's pages are reserved (``fallocate``) as batches reach them, not for its whole
size: the headroom a slot keeps for larger batches costs address space, not memory, so
two 640 MiB batches take 1.25 GiB, not twice a 800 MiB slot (over a 1.5 GiB limit).

Slots never move or shrink, so each side maps a slot once and keeps the map. A free
slot can be *retired* instead: one far larger than the batches of late (an outlier's),
or the largest free one when batches outgrew every free slot. Its pages go back to the
system, its range of the memfd is never used again, and the main process drops its map
when told (``SlotPayload.retired``).
"""

from __future__ import annotations

import collections
import errno
import mmap
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import SharedMemoryExhaustedError
from .memfd import PAGE, address_space_limited, map_range, punch_hole, round_up

__all__ = [
    "ARENA_PREFIX",
    "MIN_SLOT_BYTES",
    "PAGE",
    "SETUP_NAME",
    "MainArena",
    "SlotInfo",
    "WorkerArena",
    "create_arena_fd",
    "map_status_page",
    "round_up",
]

_MAIN, _WORKER = "main", "worker"  # who holds a leased slot
MIN_SLOT_BYTES = 1 << 16
_RECENT = 16  # batches a worker remembers the sizes of, to spot oversized slots
_OVERSIZED_MIN_BYTES = 1 << 20  # smaller slots are not worth giving back
_LOOK_AGAIN_MIN = 4  # acquisitions between two looks for oversized slots, at least
ARENA_PREFIX = "conveyor-worker-"  # memfd names: a worker's arena
SETUP_NAME = "conveyor-setup"  # the user's objects pickled once for spawned workers


def create_arena_fd(worker_id: int) -> int:
    """A new worker's memfd; its first page is the worker's status page."""
    fd = os.memfd_create(f"{ARENA_PREFIX}{worker_id}", os.MFD_CLOEXEC)
    os.ftruncate(fd, PAGE)
    return fd


def map_status_page(fd: int) -> memoryview:
    return memoryview(mmap.mmap(fd, PAGE, mmap.MAP_SHARED, offset=0))


@dataclass(frozen=True)
class SlotInfo:
    slot_id: int
    offset: int
    size: int


class WorkerArena:
    """The worker's side: hands out slots, grows the memfd, keeps maps."""

    def __init__(self, fd: int, max_slots: int, *, run_ahead_bytes: int = 0) -> None:
        """``run_ahead_bytes``: beyond ``max_slots``, slots may be added while all of
        them fit this budget (run-ahead of small batches, or held small batches)."""
        self._fd = fd
        self._max_slots = max_slots
        self._run_ahead_bytes = run_ahead_bytes
        self.status_page = map_status_page(fd)
        self._end = PAGE  # bytes of the memfd in use: the status page, then slots
        self._slots: dict[int, SlotInfo] = {}
        self.maps: dict[int, np.ndarray] = {}
        self._addresses: dict[int, int] = {}  # where each slot is mapped here
        self._reserved: dict[int, int] = {}  # bytes of each slot whose pages are reserved
        self._free: set[int] = set()
        self._budgeted: set[int] = set()  # slots counted against the run-ahead budget
        self._holders: dict[int, set[str]] = {}  # leased slots: who still uses each
        self._worker_done: list[int] = []  # slots the worker's arrays no longer use
        self._watch: dict[int, weakref.ref[np.ndarray]] = {}  # the lease base of each slot
        self._next_id = 0
        self._asked: collections.deque[int] = collections.deque(maxlen=_RECENT)  # sizes
        self._retired: list[int] = []  # slots given up since the main process was told
        self._next_check = 0  # acquisitions until oversized slots are looked for again
        # Before a slot is added: applies the releases the main process has sent and
        # this worker has not read yet; True if it freed any (see _workers/inbox.py).
        # Slots freed early (the main process sends the large ones as soon as their
        # batches are garbage) are then reused instead of growing another.
        self.reclaim: Callable[[], bool] | None = None

    def release(self, slot_ids: tuple[int, ...]) -> None:
        """The main process no longer uses these slots."""
        for slot_id in slot_ids:
            self._drop_hold(slot_id, _MAIN)

    def _drop_hold(self, slot_id: int, holder: str) -> None:
        holders = self._holders.get(slot_id)
        if holders is None:
            return
        holders.discard(holder)
        if not holders:
            del self._holders[slot_id]
            self._free.add(slot_id)

    def _collect_worker_releases(self) -> None:
        # Appended to by finalizers, which may run at any allocation: swap, then apply.
        done = self._worker_done[:]
        del self._worker_done[: len(done)]
        for slot_id in done:
            self._drop_hold(slot_id, _WORKER)

    def held_by_worker_only(self) -> int:
        """Slots the main process gave back but arrays in this worker still use."""
        self._collect_worker_releases()
        return sum(1 for holders in self._holders.values() if holders == {_WORKER})

    def acquire(self, nbytes: int) -> tuple[SlotInfo, np.ndarray] | None:
        """A free slot of at least ``nbytes``, or None when all are in use.

        The slot is held by the main process (until it says it is done) and by
        this worker (until the last array over the returned view is garbage: a
        ``collate_fn`` may keep earlier batches). It is reused only when both let
        go, so memory anyone still reads never changes.
        """
        self._collect_worker_releases()
        self._asked.append(nbytes)
        self._retire_oversized()
        best = self._smallest_free(nbytes)
        if best is None and self.reclaim is not None and self.reclaim():
            best = self._smallest_free(nbytes)  # freed by frames already sent: no growing
        if best is None:
            size = _slot_size(nbytes)
            budgeted = self._room_for(size)
            while budgeted is None and self._free:
                # Batches outgrew the free slots (length bucketing, a curriculum):
                # the largest of them make room for one of today's size.
                self._retire(max(self._free, key=lambda i: self._slots[i].size))
                budgeted = self._room_for(size)
            if budgeted is None:
                return None  # every slot is in use
            best = self._grow(nbytes)
            if budgeted:
                self._budgeted.add(best.slot_id)
        else:
            self.reserve(best.slot_id, nbytes)
            self._free.discard(best.slot_id)
        self._holders[best.slot_id] = {_MAIN, _WORKER}
        # A lease-private base: every array collate makes in the slot is a view of
        # it (NumPy collapses view chains to it, since its own base is a memoryview),
        # so it dies exactly when the worker's last such array does.
        base = np.frombuffer(memoryview(self.maps[best.slot_id]), dtype=np.uint8)  # type: ignore[arg-type, unused-ignore]
        slot_id, done = best.slot_id, self._worker_done
        # A plain weak reference with a callback: far cheaper per batch than finalize.
        self._watch[slot_id] = weakref.ref(base, lambda _: done.append(slot_id))
        return best, base

    def _smallest_free(self, nbytes: int) -> SlotInfo | None:
        best: SlotInfo | None = None
        for slot_id in self._free:
            slot = self._slots[slot_id]
            if slot.size >= nbytes and (best is None or slot.size < best.size):
                best = slot
        return best

    def reserve(self, slot_id: int, nbytes: int) -> None:
        """Make sure the first ``nbytes`` of a slot have their pages (a batch writes
        there): the kernel says now if memory is short, rather than a fault later."""
        reserved = self._reserved[slot_id]
        if nbytes <= reserved:
            return
        slot = self._slots[slot_id]
        end = min(round_up(nbytes), slot.size)
        try:
            os.posix_fallocate(self._fd, slot.offset + reserved, end - reserved)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise self._exhausted(end - reserved, exc) from exc
            raise
        self._reserved[slot_id] = end

    def _exhausted(self, size: int, exc: OSError) -> SharedMemoryExhaustedError:
        held = sum(self._reserved.values())
        return SharedMemoryExhaustedError(
            f"Could not reserve {size / 2**20:.1f} MiB of shared memory for a batch "
            f"(this worker already holds {held / 2**20:.1f} MiB): {exc.strerror}. "
            "Fix: lower batch_size, prefetch_factor or num_workers, or give the "
            "machine or container more memory."
        )

    def address(self, slot_id: int) -> int:
        """Where a slot is mapped in this process (asked once per batch: cached)."""
        return self._addresses[slot_id]

    def _room_for(self, size: int) -> bool | None:
        """Whether one more slot of ``size`` bytes may be added: True within the
        run-ahead budget (small batches run ahead, or kept by the loop), False as one
        of ``max_slots`` slots of any size, None if neither."""
        budgeted = sum(self._slots[i].size for i in self._budgeted)
        if budgeted + size <= self._run_ahead_bytes:
            return True
        if len(self._slots) - len(self._budgeted) < self._max_slots:
            return False
        return None

    def take_retired(self) -> tuple[int, ...]:
        """Slots given up since the last call: the main process drops its maps of them."""
        retired, self._retired = tuple(self._retired), []
        return retired

    def reserved_bytes(self) -> int:
        """Shared memory this worker's slots hold now."""
        return sum(slot.size for slot in self._slots.values())

    def idle_bytes(self) -> int:
        """Pages free slots keep (for the next batches to reuse) in slots large enough
        to be worth giving back (see :meth:`drop_idle_pages`)."""
        self._collect_worker_releases()
        reserved, held = self._reserved, 0
        for slot_id in self._free:
            if reserved[slot_id] >= _OVERSIZED_MIN_BYTES:
                held += reserved[slot_id]
        return held

    def drop_idle_pages(self) -> None:
        """The worker has waited a while with no task: its free slots' pages go back to
        the system (slots and maps stay; a batch reserves the pages again as it writes,
        as a fresh one would). A batch that reuses a slot costs no page faults, but a
        loop that keeps its workers waiting should not also keep their memory."""
        self._collect_worker_releases()
        for slot_id in self._free:
            if self._reserved[slot_id] >= _OVERSIZED_MIN_BYTES:
                slot = self._slots[slot_id]
                punch_hole(self._fd, slot.offset, slot.size)
                self._reserved[slot_id] = 0

    def trim(self) -> None:
        """Give back oversized free slots now (slots came back while the worker had
        nothing to collate: run far ahead, the last batches of an epoch)."""
        self._collect_worker_releases()
        self._next_check = 0
        self._retire_oversized()

    def _retire_oversized(self) -> None:
        """Give back free slots far larger than any batch lately (an outlier's): once
        ``_RECENT`` batches in a row needed less than half of one."""
        if len(self._asked) < _RECENT or self._next_check > 0:
            self._next_check -= 1
            return
        asked = self._asked
        largest = max(asked)
        wanted = _slot_size(largest)
        for slot_id in [i for i in self._free if self._slots[i].size > 2 * wanted]:
            if self._slots[slot_id].size >= _OVERSIZED_MIN_BYTES:
                self._retire(slot_id)
        # Look again as the largest recent batch leaves the window (its slot may then be
        # far larger than any batch lately), not a whole window later: an outlier late
        # in an epoch would keep its memory past the epoch's end. Looks stay apart (each
        # takes the max of the window).
        last = len(asked) - 1 - list(reversed(asked)).index(largest)  # its newest place
        self._next_check = max(last, _LOOK_AGAIN_MIN - 1)

    def _retire(self, slot_id: int) -> None:
        """Give a free slot's memory back to the system; its range is never reused."""
        slot = self._slots.pop(slot_id)
        self._free.discard(slot_id)
        self._budgeted.discard(slot_id)
        self.maps.pop(slot_id, None)  # free: no array of this worker uses the map
        self._addresses.pop(slot_id, None)
        self._watch.pop(slot_id, None)
        self._reserved.pop(slot_id, None)
        punch_hole(self._fd, slot.offset, slot.size)
        self._retired.append(slot_id)

    def _grow(self, nbytes: int) -> SlotInfo:
        size = _slot_size(nbytes)
        offset = self._end
        reserved = min(round_up(nbytes), size)
        try:
            os.ftruncate(self._fd, offset + size)
            # Reserve the batch's pages now (the headroom as batches reach it, see
            # reserve): running out later would be a fault, not an error.
            if reserved:
                os.posix_fallocate(self._fd, offset, reserved)
        except OSError as exc:
            os.ftruncate(self._fd, offset)
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise self._exhausted(reserved, exc) from exc
            raise
        slot = SlotInfo(self._next_id, offset, size)
        try:
            view = map_range(self._fd, slot.offset, slot.size, "this worker")
        except BaseException:
            os.ftruncate(self._fd, offset)
            raise
        self._end = offset + size
        self._next_id += 1
        self._slots[slot.slot_id] = slot
        self._reserved[slot.slot_id] = reserved
        self.maps[slot.slot_id] = view
        self._addresses[slot.slot_id] = view.ctypes.data
        return slot


class MainArena:
    """The main process's side: maps slots on first sight.

    A slot's map is kept for the loader's life (a batch over a slot mapped before
    costs no page faults), unless the address space is limited (``ulimit -v``, common
    on HPC nodes): then only slots in use stay mapped, and each is unmapped when the
    last array of its batch is garbage (:meth:`forget`)."""

    def __init__(self, fd: int, keep_maps: bool | None = None) -> None:
        self.fd = fd
        self.status_page = map_status_page(fd)
        self.maps: dict[int, np.ndarray] = {}  # slot id -> its map here
        self.keep_maps = not address_space_limited() if keep_maps is None else keep_maps

    def view(self, slot: SlotInfo) -> np.ndarray:
        view = self.maps.get(slot.slot_id)
        if view is None:
            if self.fd < 0:  # mmap(-1) would silently map fresh zeroed memory
                raise RuntimeError(f"slot {slot.slot_id} was not mapped before its arena closed")
            view = map_range(self.fd, slot.offset, slot.size, "the main process")
            self.maps[slot.slot_id] = view
        return view

    def forget_retired(self, slot_ids: tuple[int, ...]) -> None:
        """The worker gave these slots up: their maps go (batches alive keep theirs)."""
        for slot_id in slot_ids:
            self.maps.pop(slot_id, None)

    def forget(self, slot_id: int) -> None:
        """The batch over a slot is gone: unless maps are kept, the slot is unmapped
        once nothing else uses its map."""
        if not self.keep_maps:
            self.maps.pop(slot_id, None)

    def map_all(self, slots: list[SlotInfo]) -> None:
        """Map these slots now, so they stay readable after the fd is closed."""
        for slot in slots:
            self.view(slot)

    def drop_maps(self) -> None:
        """Forget our maps (the pool is closed): batches still alive keep their own."""
        self.maps.clear()
        self.status_page = memoryview(bytes(PAGE))

    def close(self) -> None:
        """Close the fd; maps already made stay valid (closing an fd does not unmap)
        and go with this object, or with the last array that uses them."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _slot_size(nbytes: int) -> int:
    """A new slot's size for a batch of ``nbytes``: a quarter more, for batches that vary."""
    return round_up(max(nbytes + nbytes // 4, MIN_SLOT_BYTES))
