"""A child program for the memory tests: 640 MiB batches, one after the other.

Usage: ``python big_batches.py LOADER START_METHOD`` with LOADER ``conveyor`` or
``torch``. Eight samples of 160 MiB each (free broadcast views) collated by one worker
into two batches of 640 MiB: while the loop holds the first, the worker makes the
second (prefetch), so two batches is what any loader needs at its peak. The loop reads
one value of each MiB of every sample (touching a page of each), drops the batch, and
prints one JSON line: what it read and its own peak resident memory (MiB).
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

MIB = 1 << 20
SAMPLE_MIB = 160
PER_BATCH = 4
SAMPLES = 8


class Free:
    """Sample i: SAMPLE_MIB MiB of float32 values equal to i, costing no memory."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> np.ndarray:
        return np.broadcast_to(np.float32(i), (SAMPLE_MIB * MIB // 4,))


def main() -> None:
    which, method = sys.argv[1], sys.argv[2]
    if which == "torch":
        from torch.utils.data import DataLoader
    else:
        from conveyor import DataLoader  # type: ignore[assignment]
    every_mib = MIB // 4
    read = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(
            Free(), batch_size=PER_BATCH, num_workers=1, multiprocessing_context=method
        )
        for batch in loader:
            values = np.asarray(batch)
            read.extend(
                sorted({float(v) for v in values[k, ::every_mib]}) for k in range(PER_BATCH)
            )
            del values, batch
    peak = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) // 1024
    # torch warns that broadcast views are not writable: not a conveyor matter.
    ours = [str(w.message)[:200] for w in caught if "not writable" not in str(w.message)]
    print(json.dumps({"read": read, "main_peak_mib": peak, "warnings": ours}), flush=True)


if __name__ == "__main__":
    main()
