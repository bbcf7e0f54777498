"""A child program for the memory tests: one float32 batch of MIB MiB from a worker.

Usage: ``python big_batch.py START_METHOD MIB``. The samples are free (broadcast views
of one number), so the batch is all the memory there is to see: collate should
write it straight into shared memory. The main process checks every value (touching
every page), then prints one JSON line: the batch's shape, whether its values are
right, the worker's restarts, and for the worker and the main process their peak
resident memory (VmHWM) and what is resident now, anonymous and shared (MiB).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import numpy as np

from conveyor import DataLoader

BATCH = 10


class Free:
    """Sample i: ``elements`` float32 values equal to i, costing no memory."""

    def __init__(self, elements: int) -> None:
        self.elements = elements

    def __len__(self) -> int:
        return BATCH

    def __getitem__(self, i: int) -> np.ndarray:
        return np.broadcast_to(np.float32(i), (self.elements,))


def memory(pid: int | str) -> dict[str, int]:
    """VmHWM, RssAnon, RssShmem of a process, in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssShmem"):
                fields[key] = int(value.split()[0]) // 1024
    return fields


def main() -> None:
    method, mib = sys.argv[1], int(sys.argv[2])
    elements = mib * (1 << 20) // 4 // BATCH
    report: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(
            Free(elements), batch_size=BATCH, num_workers=1, multiprocessing_context=method,
            persistent_workers=True,  # alive after the epoch: its memory can be read
        )  # fmt: skip
        [batch] = list(loader)
        stats = loader.statistics()
        assert stats is not None
        worker = stats.workers[0].pid
        report["shape"] = list(batch.shape)
        # Row by row (a comparison of the whole batch would allocate 160 MiB here):
        # every page is touched.
        report["right"] = all(bool((row == i).all()) for i, row in enumerate(batch.numpy()))
        report["restarts"] = stats.worker_restarts
        report["worker"] = memory(worker)
        report["main"] = memory("self")
    report["warnings"] = [f"{w.category.__name__}: {w.message}"[:200] for w in caught]
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
