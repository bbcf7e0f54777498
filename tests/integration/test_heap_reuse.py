"""Workers keep their freed heap for the next batch (see conveyor._workers.heap).

A dataset that makes a fresh array per sample (every decode or augmentation does) frees
a batch's worth of heap after each collate. If the worker gives it back to the system,
the next batch faults every page in again: 5 ms of a worker's CPU per 9.6 MB batch. The
worker's own page-fault counter, read by the dataset at each sample, shows it.
"""

from __future__ import annotations

import itertools
import resource
import statistics

import numpy as np
import pytest

from conveyor import DataLoader
from tests.helpers.leaks import no_leaks
from tests.integration.heap_datasets import SAMPLE_SHAPE, FreshImages

BATCH = 64
BATCHES = 10


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_fresh_samples_do_not_fault_the_batch_in_again(method):
    batch_pages = BATCH * int(np.prod(SAMPLE_SHAPE)) // resource.getpagesize()
    with no_leaks():
        loader = DataLoader(
            FreshImages(BATCH * BATCHES),
            batch_size=BATCH,
            num_workers=1,
            multiprocessing_context=method,
        )
        # The counter as each batch's first sample saw it: before that batch's allocations.
        counters = [int(faults[0]) for _, faults in loader]
        del loader
    per_batch = [after - before for before, after in itertools.pairwise(counters[2:])]
    # Given back each time, every page of the batch faults again (~2,300 here); kept, the
    # heap is reused and only the odd page faults.
    assert statistics.median(per_batch) < batch_pages / 10, (per_batch, batch_pages)
