"""Encode a batch in a worker, decode it in the main process.

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

import io
import pickle
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arena import MainArena, SlotInfo, WorkerArena

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - exercised in the no-torch CI job
    torch = None

ALIGN = 64
_UINT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


@dataclass(frozen=True, slots=True)
class SlotPayload:
    slot: SlotInfo
    meta: bytes
    layout: tuple[tuple[int, int], ...]  # (offset, nbytes) of each out-of-band buffer


@dataclass(frozen=True, slots=True)
class InlinePayload:
    data: bytes
    slots_exhausted: bool = False  # sent inline only because every slot was in use


Payload = SlotPayload | InlinePayload


class _BatchPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if torch is not None and type(obj) is torch.Tensor:
            return _reduce_tensor(obj)
        return NotImplemented


def _reduce_tensor(t: Any) -> Any:
    if t.device.type != "cpu" or t.layout != torch.strided or t.requires_grad or t.is_quantized:
        return NotImplemented
    t = t.contiguous()
    try:
        return (_tensor_from_numpy, (t.numpy(), None))
    except TypeError:  # a dtype NumPy lacks (bfloat16, float8...): ship its bytes
        carrier = _UINT_OF_SIZE.get(t.element_size())
        if carrier is None:
            return NotImplemented
        return (_tensor_from_numpy, (t.view(getattr(torch, carrier)).numpy(), str(t.dtype)))


def _tensor_from_numpy(array: np.ndarray, dtype_name: str | None) -> Any:
    tensor = torch.from_numpy(array)
    if dtype_name is not None:
        tensor = tensor.view(getattr(torch, dtype_name.removeprefix("torch.")))
    return tensor


def dumps(obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None) -> bytes:
    stream = io.BytesIO()
    _BatchPickler(stream, protocol=5, buffer_callback=buffer_callback).dump(obj)
    return stream.getvalue()


class Encoder:
    """Worker side. Raises whatever pickling raises (the caller names the culprit)."""

    def __init__(self, arena: WorkerArena) -> None:
        self.arena = arena

    def encode(self, batch: Any) -> Payload:
        buffers: list[pickle.PickleBuffer] = []
        meta = dumps(batch, buffers.append)
        if not buffers:
            return InlinePayload(meta)
        raws = [b.raw() for b in buffers]
        layout: list[tuple[int, int]] = []
        end = 0
        for raw in raws:
            layout.append((end, raw.nbytes))
            end = (end + raw.nbytes + ALIGN - 1) // ALIGN * ALIGN
        acquired = self.arena.acquire(end)
        if acquired is None:
            return InlinePayload(dumps(batch), slots_exhausted=True)
        slot, view = acquired
        for raw, (offset, nbytes) in zip(raws, layout):
            view[offset : offset + nbytes] = np.frombuffer(raw, dtype=np.uint8)
        for b in buffers:
            b.release()
        return SlotPayload(slot, meta, tuple(layout))


class Decoder:
    """Main-process side, one per worker."""

    def __init__(self, arena: MainArena, on_release: Callable[[int], None]) -> None:
        self.arena = arena
        self._on_release = on_release

    def decode(self, payload: Payload) -> Any:
        if isinstance(payload, InlinePayload):
            return pickle.loads(payload.data)
        region = self.arena.view(payload.slot)
        # A batch-private base array: every array of the batch is a view of it
        # (NumPy collapses view chains down to it, no further, because its own
        # base is a memoryview), so it dies exactly when the last one does.
        base = np.frombuffer(memoryview(region), dtype=np.uint8)
        buffers = [base[offset : offset + nbytes] for offset, nbytes in payload.layout]
        batch = pickle.loads(payload.meta, buffers=buffers)
        del buffers
        finalizer = weakref.finalize(base, self._on_release, payload.slot.slot_id)
        finalizer.atexit = False
        return batch

    def discard(self, payload: Payload) -> None:
        """Give back a payload's slot without decoding it (an abandoned epoch)."""
        if isinstance(payload, SlotPayload):
            self._on_release(payload.slot.slot_id)
