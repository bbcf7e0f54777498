"""A slot being filled with one batch (the worker's side): collate writes its outputs
into it, then the encoder places the rest of the batch's buffers after them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .arena import SlotInfo, WorkerArena

__all__ = ["ALIGN", "SlotLease", "align"]


ALIGN = 64


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class SlotLease:
    """A slot being filled with one batch: collate writes into it, then the encoder.

    Collate asks for output buffers with :meth:`allocate` (a bump allocator);
    the encoder then :meth:`place`-s every buffer the pickle produced: those
    already inside the slot stay where they are, the rest are copied after.
    """

    def __init__(
        self,
        slot: SlotInfo,
        view: np.ndarray,
        address: int | None = None,
        arena: WorkerArena | None = None,
        reserved: int | None = None,
    ) -> None:
        """``arena`` reserves pages past the first ``reserved`` bytes as they are
        written (without one, the whole slot is taken as reserved)."""
        self.slot = slot
        self.view = view
        self.used = 0
        # The slot's address in this process (the arena knows it: asking the view
        # costs a microsecond, once per batch).
        self.base = view.ctypes.data if address is None else address
        self._arena = arena
        self._reserved = slot.size if reserved is None or arena is None else reserved

    def _reach(self, end: int) -> None:
        """Bytes up to ``end`` are about to be written: their pages must be reserved."""
        if end > self._reserved and self._arena is not None:
            self._arena.reserve(self.slot.slot_id, end)
            self._reserved = end

    def allocate(self, nbytes: int) -> np.ndarray | None:
        start = self.used
        if start + nbytes > self.slot.size:
            return None
        self._reach(start + nbytes)
        self.used = align(start + nbytes)
        return self.view[start : start + nbytes]

    def place_arrays(self, arrays: list[np.ndarray]) -> tuple[tuple[int, int], ...] | None:
        """:meth:`place` for C-contiguous arrays, without a buffer per array."""
        layout = []
        for array in arrays:
            nbytes = array.nbytes
            offset = array.ctypes.data - self.base if nbytes else 0
            if not (offset >= 0 and offset + nbytes <= self.used):
                offset = self.used
                if offset + nbytes > self.slot.size:
                    return None
                self._reach(offset + nbytes)
                self.view[offset : offset + nbytes] = array.reshape(-1).view(np.uint8)
                self.used = align(offset + nbytes)
            layout.append((offset, nbytes))
        return tuple(layout)

    def place(self, raws: list[memoryview]) -> tuple[tuple[int, int], ...] | None:
        """Offsets of ``raws`` in the slot, copying those not already there; None if full."""
        layout = []
        for raw in raws:
            nbytes = raw.nbytes
            source = np.frombuffer(raw, dtype=np.uint8)
            offset = source.ctypes.data - self.base if nbytes else 0
            if not (offset >= 0 and offset + nbytes <= self.used):
                offset = self.used
                if offset + nbytes > self.slot.size:
                    return None
                self._reach(offset + nbytes)
                self.view[offset : offset + nbytes] = source
                self.used = align(offset + nbytes)
            layout.append((offset, nbytes))
        return tuple(layout)
