"""The reference loop: the least a multi-process shared-memory loader has to do.

Forked workers write each sample straight into a slot of shared memory they own; the main
process hands the consumer views of the slot and gives the slot back when the consumer
asks for the next batch. Nothing else: no ordering book, no leases, no supervision, no
error handling, no state. Its throughput is what conveyor's design could reach on this
machine with the same number of workers, so the benchmark reports conveyor's share of it.

Only for ``(value, int label)`` samples with a fixed value shape, a sequential sampler
and complete batches: the benchmark's ``tiny``, ``image``, ``fresh`` and ``decode``
workloads. Each worker calls the dataset for every sample, so a dataset that makes a new
array each time (``fresh``, ``decode``) costs the reference loop what it costs a loader;
each seeds Python's and NumPy's generators for itself, as a loader's workers do, so random
augmentations differ between them.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from conveyor_bench.workloads import MapDataset

_SLOTS = 4  # per worker: as deep as conveyor's default prefetch, plus the batch held
_LABEL = np.dtype(np.int64)


@dataclass(frozen=True)
class _Layout:
    """Where a batch's values and labels lie in a slot."""

    batch_size: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def values_bytes(self) -> int:
        return self.batch_size * int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def slot_bytes(self) -> int:
        return self.values_bytes + self.batch_size * _LABEL.itemsize

    def views(self, arena: mmap.mmap, slot: int) -> tuple[np.ndarray, np.ndarray]:
        start = slot * self.slot_bytes
        values = np.frombuffer(
            arena, self.dtype, self.batch_size * int(np.prod(self.shape)), start
        ).reshape(self.batch_size, *self.shape)
        labels = np.frombuffer(arena, _LABEL, self.batch_size, start + self.values_bytes)
        return values, labels


def _produce(
    dataset: MapDataset,
    layout: _Layout,
    arena: mmap.mmap,
    batches: range,
    ready: Connection,
    freed: Connection,
    others: list[Connection],
    seed: int,
) -> None:
    """A worker: fill slots in turn with its batches; reuse a slot once it is given back."""
    for connection in others:  # forked copies: the main process's ends must close here
        connection.close()  # too, or a stopped loop would never reach us as EOF
    random.seed(seed)  # forked: otherwise every worker would draw what the others draw
    np.random.seed(seed & 0xFFFFFFFF)
    with contextlib.suppress(EOFError, BrokenPipeError, KeyboardInterrupt):
        for count, batch in enumerate(batches):
            slot = count % _SLOTS
            if count >= _SLOTS:
                freed.recv_bytes()  # slots come back in the order they were sent
            values, labels = layout.views(arena, slot)
            first = batch * layout.batch_size
            for row in range(layout.batch_size):
                values[row], labels[row] = dataset[first + row]
            ready.send_bytes(slot.to_bytes(1, "little"))


class SharedMemoryLoop:
    """Iterate ``dataset`` in batches with ``num_workers`` forked workers (see module)."""

    def __init__(self, dataset: MapDataset, batch_size: int, num_workers: int = 2) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers

    def __iter__(self) -> Iterator[Any]:
        value, _ = self.dataset[0]
        value = np.asarray(value)
        layout = _Layout(self.batch_size, value.shape, value.dtype)
        total = len(self.dataset) // self.batch_size
        workers = self.num_workers
        context = multiprocessing.get_context("fork")
        arenas = [mmap.mmap(-1, _SLOTS * layout.slot_bytes) for _ in range(workers)]
        ready = [context.Pipe(duplex=False) for _ in range(workers)]
        freed = [context.Pipe(duplex=False) for _ in range(workers)]
        connections = [c for pair in ready + freed for c in pair]
        base_seed = random.getrandbits(63)  # as a loader draws its base seed, per epoch
        processes = [
            context.Process(
                target=_produce,
                args=(
                    self.dataset,
                    layout,
                    arenas[w],
                    range(w, total, workers),
                    ready[w][1],
                    freed[w][0],
                    [c for c in connections if c is not ready[w][1] and c is not freed[w][0]],
                    base_seed + w,
                ),
                daemon=True,
            )
            for w in range(workers)
        ]
        for process in processes:
            process.start()
        for w in range(workers):  # the workers' ends
            ready[w][1].close()
            freed[w][0].close()
        tensor = _to_tensor()
        try:
            for batch in range(total):
                w = batch % workers
                slot = ready[w][0].recv_bytes()
                values, labels = layout.views(arenas[w], slot[0])
                yield tensor(values), tensor(labels)
                del values, labels
                if batch + _SLOTS * workers < total:  # the worker fills this slot again
                    freed[w][1].send_bytes(slot)
        finally:
            for w in range(workers):
                ready[w][0].close()
                freed[w][1].close()
            for process in processes:
                process.join(2.0)
                if process.is_alive():
                    process.kill()
                    process.join()


def _to_tensor() -> Any:
    """What a loader's default collate gives: tensors where torch is loaded, else arrays."""
    torch = sys.modules.get("torch")
    return torch.from_numpy if torch is not None else (lambda array: array)
