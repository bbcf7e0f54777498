"""Batches through Ray's object store (remote workers, see _workers/ray_pool.py).

In the worker, a batch is pickled with protocol 5, its arrays out of band (the codec's
pickler: CPU tensors travel as their storage's bytes), and returned to Ray as that small
pickle plus the arrays. Ray writes the arrays into its object store once; the driver's
``ray.get`` of a batch made on its own node, or fetched to it, gives NumPy views of the
store's memory: no copy. The driver rebuilds the batch on those views (tensors made
there from NumPy when the worker deferred torch), and the memory goes back to the
store when the batch is garbage.

Ray hands those views out read-only (its objects are immutable to other readers). The
batch is this loader's alone, as a shared-memory slot is: it is rebuilt on writable
views of the same memory, so tensors behave as torch's (writable, no warning), and the
read-only arrays are kept alive by the views, which keeps Ray from reusing the memory.
"""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

from .pickler import dumps

__all__ = ["ObjectStoreBatch", "ObjectStoreEncoder", "StorePayload"]


@dataclass(frozen=True)
class StorePayload:
    """A batch as a worker returns it to Ray: the pickle, and its arrays' bytes."""

    meta: bytes
    buffers: tuple[np.ndarray, ...]  # uint8, one per out-of-band buffer, in order

    @property
    def nbytes(self) -> int:
        return len(self.meta) + sum(b.nbytes for b in self.buffers)


class ObjectStoreEncoder:
    """The worker's transport (see core.Transport): nothing to lease, Ray's object store
    holds each batch until the driver lets go of it."""

    arrays_as_tensors = False  # set by the core: NumPy leaves that stand for tensors

    def collating(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def encode(self, batch: Any) -> StorePayload:
        buffers: list[pickle.PickleBuffer] = []
        meta = dumps(batch, buffers.append, arrays_as_tensors=self.arrays_as_tensors)
        # Views of the batch's own memory: Ray copies them into its store, once.
        arrays = tuple(np.frombuffer(b.raw(), dtype=np.uint8) for b in buffers)
        return StorePayload(meta, arrays)


class _Writable:
    """A writable NumPy view of a read-only array's memory; holding the array keeps the
    memory (Ray's object, pinned while the array lives) for as long as the view."""

    __slots__ = ("__array_interface__", "_array")

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.__array_interface__ = {
            "data": (array.ctypes.data, False),
            "shape": array.shape,
            "typestr": array.dtype.str,
            "version": 3,
        }


def writable(array: np.ndarray) -> np.ndarray:
    """``array``'s memory, writable (itself if it is)."""
    if array.flags.writeable:
        return array
    if array.size == 0:
        return np.empty(array.shape, array.dtype)
    return np.asarray(_Writable(np.ascontiguousarray(array)))


class ObjectStoreBatch:
    """A remote worker's batch as the loop receives it (see api.BatchHandle)."""

    __slots__ = ("_payload", "nbytes")

    def __init__(self, payload: StorePayload) -> None:
        self._payload: StorePayload | None = payload
        self.nbytes = payload.nbytes  # what crossed the object store, for statistics

    def open(self) -> Any:
        payload, self._payload = self._payload, None
        assert payload is not None, "a batch is opened once"
        return pickle.loads(payload.meta, buffers=[writable(b) for b in payload.buffers])

    def discard(self) -> None:
        self._payload = None  # the store frees it when the last reference goes
