"""Decode a batch in the main process, and give its slot back when it dies.

The batch's arrays are views of its slot (see codec.py); the last of them to be garbage
collected frees the slot, noted by a weak reference and given back to the worker with
its next task (or alone: see WorkerPool).
"""

from __future__ import annotations

import pickle
import sys
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arena import MainArena
from .codec import KNOWN_STRUCTURES, Payload, SlotPayload


@dataclass(frozen=True)
class _Plan:
    """How to rebuild a plain batch (``SlotPayload.plain``) from its buffers alone: its
    container, and each leaf's dtype, shape and whether it is a tensor."""

    kind: type
    keys: tuple[str, ...] | None  # a dict's, in order
    leaves: tuple[tuple[np.dtype[Any], tuple[int, ...], bool], ...]
    from_numpy: Any = None  # torch's, for the tensor leaves (only where torch is loaded)

    @staticmethod
    def of(batch: Any, buffers: list[np.ndarray]) -> _Plan | None:
        """The plan that rebuilds ``batch``, if each of its leaves is exactly one of
        ``buffers`` (in order) seen as an array or a tensor; else None."""
        kind = type(batch)
        if kind is dict:
            keys: tuple[str, ...] | None = tuple(batch)
            values = list(batch.values())
        elif kind is list or kind is tuple:
            keys, values = None, list(batch)
        else:
            return None
        if len(values) != len(buffers):
            return None
        torch = sys.modules.get("torch")
        leaves = []
        for value, buffer in zip(values, buffers, strict=True):
            is_tensor = torch is not None and type(value) is torch.Tensor
            array = value.numpy() if is_tensor else value
            if type(array) is not np.ndarray or not array.flags.c_contiguous:
                return None
            if array.nbytes != buffer.nbytes or (
                array.nbytes and array.ctypes.data != buffer.ctypes.data
            ):
                return None
            leaves.append((array.dtype, array.shape, is_tensor))
        return _Plan(kind, keys, tuple(leaves), torch.from_numpy if torch is not None else None)

    def build(self, base: np.ndarray, layout: tuple[tuple[int, int], ...]) -> Any:
        ndarray, leaves, from_numpy = np.ndarray, [], self.from_numpy
        for (dtype, shape, is_tensor), (offset, _) in zip(self.leaves, layout, strict=True):
            leaf: np.ndarray = ndarray(shape, dtype, base, offset)
            leaves.append(from_numpy(leaf) if is_tensor else leaf)
        if self.keys is not None:
            return dict(zip(self.keys, leaves, strict=True))
        return leaves if self.kind is list else tuple(leaves)


class _Watch(weakref.ref[np.ndarray]):
    """A weak reference to a batch's base array that carries its slot. Its callback is a
    deque's ``append``, C alone: a Ctrl-C that arrives as a batch dies is then raised in
    the code that collects it, never inside the callback, where Python would print it as
    ignored and the user's interrupt would be lost."""

    __slots__ = ("slot_id",)
    slot_id: int


class Decoder:
    """Main-process side, one per worker."""

    def __init__(self, arena: MainArena, on_release: Callable[[int], None]) -> None:
        self.arena = arena
        self._give_back = on_release
        # The base array of each slot's batch, watched: a weak reference with a callback
        # costs a sixth of a weakref.finalize, once per batch.
        self._watch: dict[int, _Watch] = {}
        # Watched, died, not yet collected: looked at (no call) before each collect().
        self.dead: deque[_Watch] = deque()
        # Plain batches by their pickle: unpickled once, then built from the plan
        # (half the cost: no pickle machinery, no reconstructor calls).
        self._plans: dict[bytes, _Plan | None] = {}

    @property
    def batches_alive(self) -> int:
        """Decoded batches over slots whose arrays are still alive."""
        return len(self._watch) - len(self.dead)

    def collect(self) -> None:
        """Give back the slots of the batches that died since (see _Watch): the pool
        does before it reads the slots to give back (see Worker.pending_releases)."""
        dead = self.dead
        while dead:
            # Taken before it is acted on: a Ctrl-C between the two loses the slot (its
            # worker goes on with the others, or through the pipe), never gives it back
            # twice (two batches in one slot).
            self._on_release(dead.popleft().slot_id)

    def _on_release(self, slot_id: int) -> None:
        """The batch over ``slot_id`` is garbage (or was never handed out)."""
        self._watch.pop(slot_id, None)
        if not self.arena.keep_maps:
            self.arena.forget(slot_id)
        self._give_back(slot_id)

    def decode(self, payload: Payload) -> Any:
        """The batch of ``payload``."""
        if type(payload) is not SlotPayload:
            return pickle.loads(payload.data)  # type: ignore[union-attr]
        if payload.retired:
            self.arena.forget_retired(payload.retired)
        slot_id = payload.slot.slot_id
        region = self.arena.maps.get(slot_id)  # mapped on receipt (see WorkerPool)
        if region is None:
            region = self.arena.view(payload.slot)
        # A batch-private base array: every array of the batch is a view of it
        # (NumPy collapses view chains down to it, no further, because its own
        # base is a memoryview), so it dies exactly when the last one does.
        base = np.frombuffer(memoryview(region), dtype=np.uint8)  # type: ignore[arg-type, unused-ignore]
        plan = self._plans.get(payload.meta) if payload.plain else None
        if plan is not None:
            batch = plan.build(base, payload.layout)
        else:
            buffers = [base[offset : offset + nbytes] for offset, nbytes in payload.layout]
            try:
                batch = pickle.loads(payload.meta, buffers=buffers)
            except BaseException:
                # Nothing of the batch reaches the user: the slot goes back now (the
                # failed unpickle's frames may keep ``base`` alive for a long while).
                self._on_release(slot_id)
                raise
            if payload.plain and payload.meta not in self._plans:
                if len(self._plans) >= KNOWN_STRUCTURES:
                    self._plans.clear()
                self._plans[payload.meta] = _Plan.of(batch, buffers)
            del buffers
        watch = self._watch[slot_id] = _Watch(base, self.dead.append)
        watch.slot_id = slot_id
        return batch

    def discard(self, payload: Payload) -> None:
        """Give back a payload's slot without decoding it (an abandoned epoch)."""
        if isinstance(payload, SlotPayload):
            self.arena.forget_retired(payload.retired)
            self._on_release(payload.slot.slot_id)


class PayloadHandle:
    """A payload not yet decoded, with the decoder of the worker that sent it (which may
    be replaced before the batch is handed out): the process pool's batch handle.
    ``opening`` runs first, on the thread that hands batches out (the pool sends the
    slots freed since: the batch handed out before is usually gone by now)."""

    __slots__ = ("decoder", "opening", "payload")

    def __init__(
        self, decoder: Decoder, payload: Payload, opening: Callable[[], None] | None = None
    ) -> None:
        self.decoder = decoder
        self.payload = payload
        self.opening = opening

    def open(self) -> Any:
        if self.opening is not None:
            self.opening()
        return self.decoder.decode(self.payload)

    def discard(self) -> None:
        self.decoder.discard(self.payload)

    @property
    def nbytes(self) -> int:
        """About what crossed: the slot up to its last buffer's end, and the pickle (read
        once per batch: no sum over the buffers)."""
        payload = self.payload
        if type(payload) is SlotPayload:
            layout = payload.layout
            return (layout[-1][0] + layout[-1][1] if layout else 0) + len(payload.meta)
        return len(payload.data)  # type: ignore[union-attr]
