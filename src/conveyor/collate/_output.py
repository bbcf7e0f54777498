"""Arrays a collate function of the user's own makes for its batch, in the memory the
batch travels in.

A worker sends a batch through a shared-memory slot: arrays ``default_collate`` stacks
are written there as they are made, but a collate function of the user's own
(padding, say) makes its arrays on the heap, and the worker then copies each into the
slot. For a batch of large arrays that copy is most of what sending costs (``text`` in
the benchmark: half a megabyte a batch). :func:`empty` and :func:`zeros` take their
memory from the slot while a worker collates, so the arrays are already where the main
process reads them; anywhere else (no workers, thread workers, torch's loader) they are
NumPy's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.collate._leaves import _out_buffer

__all__ = ["empty", "zeros"]


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def empty(shape: int | tuple[int, ...], dtype: Any = float) -> np.ndarray:
    """``numpy.empty(shape, dtype)`` for a collate function to fill and return: while a
    conveyor worker collates, its memory is in the batch's shared-memory slot, so the
    batch crosses to the main process without a copy. Anywhere else, or when the slot
    has no room left, it is ``numpy.empty``'s.

    Meant for what the batch returns: an array made here and dropped takes room in the
    slot until the batch is sent."""
    shape, dtype = _shape(shape), np.dtype(dtype)
    out = _out_buffer(shape, dtype)
    return out if out is not None else np.empty(shape, dtype)


def zeros(shape: int | tuple[int, ...], dtype: Any = float) -> np.ndarray:
    """``numpy.zeros(shape, dtype)``, in the batch's shared memory as :func:`empty` is (a
    slot is reused from batch to batch: this one is zeroed here)."""
    shape, dtype = _shape(shape), np.dtype(dtype)
    out = _out_buffer(shape, dtype)
    if out is None:
        return np.zeros(shape, dtype)
    out.fill(0)
    return out
