"""Workers leave what they inherited out of their garbage collections.

A full collection writes to the header of every object it visits. In a forked
worker that is every object the training process had (torch's modules, the
dataset's lists...), so one collection copies all their pages into the worker:
with torch loaded, 50 MiB a worker for torch's loader and 9 MiB for conveyor's in
``benchmarks/copy_on_read.py --collect 100000`` (dataset in a SharedList).
"""

from __future__ import annotations

import gc

import conveyor


class FreezeCount:
    """Each sample runs a full collection, as a long run eventually does, and returns how
    many objects were left out of it (the permanent generation)."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> int:
        gc.collect()
        return gc.get_freeze_count()


def test_a_forked_worker_never_collects_what_it_inherited() -> None:
    inherited = len(gc.get_objects())
    frozen_here = gc.get_freeze_count()  # not 0 everywhere: 3.12 starts with some frozen
    counts = _freeze_counts("fork")
    # Everything the parent had when it forked; a few of those the worker may free.
    assert min(counts) >= 0.9 * inherited
    assert gc.get_freeze_count() == frozen_here  # the training process collects as before


def test_a_fork_server_worker_never_collects_what_the_server_had() -> None:
    # The server imported the standard library, NumPy and conveyor's worker: thousands
    # of objects, none of them this process's.
    assert min(_freeze_counts("forkserver")) > 1000


def _freeze_counts(method: str) -> list[int]:
    loader = conveyor.DataLoader(
        FreezeCount(), batch_size=None, num_workers=1, multiprocessing_context=method
    )
    counts = [int(count) for count in loader]
    assert len(counts) == 3
    return counts
