"""Small batches run ahead of prefetch_factor (fewer sleeps on few cores), deterministically."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader
from conveyor._task.protocol import HELD_BEYOND_PREFETCH
from conveyor._transport.arena import MIN_SLOT_BYTES
from conveyor._transport.budget import run_ahead, run_ahead_bytes
from tests.helpers.leaks import no_leaks


class CountingBatches:
    """Batches of 4 consecutive indices; counts how many the loader has drawn."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.drawn = 0

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[list[int]]:
        for b in range(self.batches):
            self.drawn += 1
            yield list(range(4 * b, 4 * b + 4))


class RandomValues:
    """Sample i: (i, a draw from the worker's random stream)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, random.random()


@pytest.mark.parametrize("ahead", [True, False])
def test_small_batches_are_sent_beyond_prefetch_only_with_run_ahead(ahead: bool) -> None:
    sampler = CountingBatches(1000)
    loader = DataLoader(
        list(range(4000)),
        batch_sampler=sampler,
        num_workers=2,
        prefetch_factor=2,
        multiprocessing_context="fork",
        run_ahead=ahead,
    )
    with no_leaks():
        it = iter(loader)
        assert [next(it).tolist()[0] for _ in range(10)] == list(range(0, 40, 4))
        budget = run_ahead_bytes(2)
        extra = run_ahead(MIN_SLOT_BYTES, 2 + HELD_BEYOND_PREFETCH, budget) if ahead else 0
        # Topped up when a quick batch arrived, then one more per batch handed out.
        assert sampler.drawn == (2 + extra) * 2 + 10
        assert [b.tolist()[0] for b in it] == list(range(40, 4000, 4))
        del it


def _epochs_after_a_break(run_ahead: bool) -> list[list[float]]:
    loader = DataLoader(
        RandomValues(),
        batch_size=2,
        generator=np.random.default_rng(7),
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        run_ahead=run_ahead,
    )
    epochs = []
    for epoch in range(3):
        values = []
        for n, (_, drawn) in enumerate(loader):
            values += drawn.tolist()
            if epoch == 0 and n == 7:
                break  # the tasks still out run in the workers and draw from their streams
        epochs.append(values)
    return epochs


def test_a_break_with_run_ahead_repeats_itself() -> None:
    # How many tasks are out at a break does not depend on timing: the run-ahead is
    # topped up once, when the first quick batch arrives, then one task per batch handed
    # out. (A worker's first batches are not quick: its start and its slots being added
    # take milliseconds, so the break comes after a few batches, where a batch quick
    # enough has come on any machine: at the third, the earliest, a main process that
    # hands batches out faster than those first replies come could break before it.)
    with no_leaks():
        first = _epochs_after_a_break(run_ahead=True)
        assert _epochs_after_a_break(run_ahead=True) == first
        assert len(first[1]) == len(first[2]) == 64


class OneOutlier:
    """Sample 5 is 64 MiB, the others 1 KiB."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> Any:
        return np.full((64 << 20) if index == 5 else 1024, index % 256, dtype=np.uint8)


def test_an_outlier_among_small_batches_run_ahead_stays_in_shared_memory() -> None:
    # Every small slot may be in flight when the outlier comes: it gets a slot of its
    # own (it once went through the pipe with a false "slots held" warning, an error here).
    loader = DataLoader(OneOutlier(), batch_size=1, num_workers=1, multiprocessing_context="fork")
    with no_leaks():
        sizes = [int(np.prod(b.shape)) for b in loader]  # torch tensors or NumPy arrays
        assert sizes[5] == 64 << 20 and sizes.count(1024) == 99
        del loader
