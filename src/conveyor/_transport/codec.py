"""Encode a batch in a worker (the main process decodes it: decoder.py).

A batch is pickled with protocol 5. Array data (NumPy arrays, and CPU torch
tensors, which are reduced to NumPy views of themselves) leaves the pickle
*out of band* and is copied into a shared-memory slot; the pickle itself, now
only structure and small leaves, crosses the pipe. The main process rebuilds
the batch with its arrays as views on the slot: no copy. The slot goes back to
the worker when the last of those arrays is garbage collected.

When every slot is held (the user keeps many batches alive) the batch is sent
whole through the pipe instead: slower, never stuck.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._task.protocol import builder
from ..collate import OUTPUT_ALLOCATOR
from .arena import SlotInfo, WorkerArena
from .lease import SlotLease, align
from .pickler import dumps


@dataclass(frozen=True)
class SlotPayload:
    slot: SlotInfo
    meta: bytes
    layout: tuple[tuple[int, int], ...]  # (offset, nbytes) of each out-of-band buffer
    retired: tuple[int, ...] = ()  # slots the worker gave up since its last SlotPayload
    # A flat list, tuple or str-keyed dict of plain arrays, one per buffer in order:
    # the main process may rebuild it without unpickling (see Decoder).
    plain: bool = False


@dataclass(frozen=True)
class InlinePayload:
    data: bytes
    slots_exhausted: bool = False  # sent inline only because every slot was in use
    held_in_worker: int = 0  # of those, slots that arrays kept in the worker still use


Payload = SlotPayload | InlinePayload
_slot_payload = builder(SlotPayload)  # once a batch: without the frozen __init__'s cost


class Encoder:
    """Worker side. ``encode`` raises whatever pickling raises (the caller names the culprit)."""

    def __init__(
        self,
        arena: WorkerArena,
        *,
        arrays_as_tensors: bool = False,
        reclaim: Callable[[], bool] | None = None,
    ) -> None:
        self.arena = arena
        # Called when no slot is free: applies releases the main process has sent but
        # this worker has not read yet; True if it freed any (see _workers/inbox.py).
        self._reclaim = reclaim
        # The batch came from our default collate in a worker deferring torch:
        # its NumPy leaves stand for tensors (see conveyor._torch).
        self._arrays_as_tensors = arrays_as_tensors
        # Bytes the next batch likely takes: the smaller of the last two (batches are
        # usually alike, and one outlier must not size the next slot too).
        self._size_hint = 0
        self._last_used = 0
        self._lease: SlotLease | None = None
        self._metas: dict[tuple[Any, ...], bytes] = {}  # see _encode_known

    @property
    def arrays_as_tensors(self) -> bool:
        """NumPy leaves stand for tensors the main process makes (see conveyor._torch);
        set to False once a registered collate function ran (its arrays are arrays)."""
        return self._arrays_as_tensors

    @arrays_as_tensors.setter
    def arrays_as_tensors(self, value: bool) -> None:
        if value != self._arrays_as_tensors:
            self._metas.clear()  # pickles made the other way
        self._arrays_as_tensors = value

    def collating(self) -> _Collating:
        """Let collate stack arrays straight into a slot sized like the last batch.

        Before the first batch no size is known: the slot is taken at collate's first
        request, sized for that array (with the arena's slack for the small ones that
        follow), so even the first batch is never stacked on the heap and then copied
        (a 640 MiB batch would need twice that at its peak).
        """
        if self._lease is not None:
            # The last batch never reached encode (its fetch or collate failed): its slot
            # goes back, once the worker's arrays in it are garbage too.
            self.arena.release((self._lease.slot.slot_id,))
        self._lease = self._acquire(self._size_hint) if self._size_hint else None
        return _Collating(self._lease.allocate if self._lease else self._allocate_first)

    def _allocate_first(self, nbytes: int) -> np.ndarray | None:
        if self._lease is None:
            self._lease = self._acquire(nbytes)
            if self._lease is None:
                return None
        return self._lease.allocate(nbytes)

    def encode(self, batch: Any) -> Payload:
        lease, self._lease = self._lease, None
        if lease is not None:
            known = self._encode_known(batch, lease)
            if known is not None:
                return known
        try:
            buffers: list[pickle.PickleBuffer] = []
            meta = dumps(batch, buffers.append, arrays_as_tensors=self.arrays_as_tensors)
            raws = [b.raw() for b in buffers]
            layout = lease.place(raws) if lease is not None and raws else None
            if layout is None:
                # The leased slot (if any) is too small or unneeded: lay the
                # buffers out in a fresh one, taken before the lease is given up
                # so the two never overlap.
                fresh = self._acquire(_packed_size(raws)) if raws else None
                if lease is not None:
                    self.arena.release((lease.slot.slot_id,))
                lease = fresh
                if raws:
                    if lease is None:
                        data = dumps(batch, arrays_as_tensors=self.arrays_as_tensors)
                        held = self.arena.held_by_worker_only()
                        return InlinePayload(data, slots_exhausted=True, held_in_worker=held)
                    layout = lease.place(raws)
            if lease is None or layout is None:
                return InlinePayload(meta)
            self._remember_size(lease.used)
            for b in buffers:
                b.release()
            plain = self._remember(batch, meta, layout)
            return SlotPayload(lease.slot, meta, layout, self.arena.take_retired(), plain)
        except BaseException:
            if lease is not None:
                self.arena.release((lease.slot.slot_id,))
            raise

    def _encode_known(self, batch: Any, lease: SlotLease) -> SlotPayload | None:
        """The payload of a batch shaped like one encoded before, without pickling.

        The commonest batch is a list, tuple or dict of arrays, most of them stacked
        straight into the slot by collate. Its pickle holds no data (the arrays go out
        of band), only the structure, dtypes and shapes, so a batch with the same ones
        has the same pickle: only where the arrays lie in the slot is new.
        """
        arrays = _plain_arrays(batch)
        if arrays is None:
            return None
        meta = self._metas.get(_structure(batch, arrays))
        if meta is None:
            return None
        layout = lease.place_arrays(arrays)
        if layout is None:
            return None
        self._remember_size(lease.used)
        retired = self.arena.take_retired()
        return _slot_payload(slot=lease.slot, meta=meta, layout=layout, retired=retired, plain=True)

    def _remember_size(self, used: int) -> None:
        self._size_hint, self._last_used = min(used, self._last_used or used), used

    def _remember(self, batch: Any, meta: bytes, layout: tuple[tuple[int, int], ...]) -> bool:
        """Keep the pickle of a batch that _encode_known can reuse: one out-of-band
        buffer per array, in order (so the pickle refers to exactly these arrays).
        True if the batch is such a plain one."""
        arrays = _plain_arrays(batch)
        if arrays is None or len(arrays) != len(layout):
            return False
        if any(a.nbytes != nbytes for a, (_, nbytes) in zip(arrays, layout, strict=True)):
            return False
        if len(self._metas) >= KNOWN_STRUCTURES:
            self._metas.clear()
        self._metas[_structure(batch, arrays)] = meta
        return True

    def _acquire(self, nbytes: int) -> SlotLease | None:
        acquired = self.arena.acquire(nbytes)
        if acquired is None and self._reclaim is not None and self._reclaim():
            acquired = self.arena.acquire(nbytes)
        if acquired is None:
            return None
        slot, view = acquired
        return SlotLease(slot, view, self.arena.address(slot.slot_id), self.arena, nbytes)


class _Collating:
    """The allocator collate uses while this is entered (a class, not a generator-based
    context manager: entered once per batch, that costs a microsecond less)."""

    __slots__ = ("_allocate", "_token")

    def __init__(self, allocate: Callable[[int], np.ndarray | None]) -> None:
        self._allocate = allocate

    def __enter__(self) -> None:
        self._token = OUTPUT_ALLOCATOR.set(self._allocate)

    def __exit__(self, *exc: object) -> None:
        OUTPUT_ALLOCATOR.reset(self._token)


KNOWN_STRUCTURES = 64  # batch structures an encoder (or a decoder) keeps the pickle of
_PLAIN_KINDS = frozenset("biufc")  # dtypes whose pickle is only their name (no fields)


def _plain_arrays(batch: Any) -> list[np.ndarray] | None:
    """The arrays of a flat list, tuple or str-keyed dict of distinct, writable,
    C-contiguous arrays of plain dtypes; else None."""
    kind = type(batch)
    if kind is list or kind is tuple:
        arrays = list(batch)
    elif kind is dict and all(type(key) is str for key in batch):
        arrays = list(batch.values())
    else:
        return None
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype.kind not in _PLAIN_KINDS:
            return None
        flags = a.flags
        if not (flags.c_contiguous and flags.writeable):
            return None
    if len(set(map(id, arrays))) != len(arrays):
        return None
    return arrays


def _structure(batch: Any, arrays: list[np.ndarray]) -> tuple[Any, ...]:
    key = [type(batch), tuple(batch) if type(batch) is dict else len(batch)]
    for a in arrays:  # (a loop, not a generator: once a batch)
        key.append(a.dtype.str)
        key.append(a.shape)
    return tuple(key)


def _packed_size(raws: list[memoryview]) -> int:
    return sum(align(raw.nbytes) for raw in raws)
