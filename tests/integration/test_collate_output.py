"""A collate function of the user's own makes its arrays in the batch's shared memory
(``conveyor.collate.empty``/``zeros``): in a process worker they are views of the slot the
batch travels in (no copy to send it) and arrive whole, the padding zeroed though the slot
held another batch before; anywhere else they are NumPy's own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor.collate import empty, zeros

_FULL = np.random.default_rng(7).random(200) < 0.5  # which batches of 5 are full rows


def _length(i: int) -> int:
    """Batches of 5 of full rows of 7 tokens, or of one token and 6 of padding, in no
    order a worker's round of slots could follow: its slots held full rows before."""
    return 7 if _FULL[i // 5] or i % 5 == 0 else 1


class Documents:
    """Sample ``i``: ``_length(i)`` tokens, each ``i + 1`` (never 0: padding shows)."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(_length(i), i + 1, dtype=np.int64)


def padding(samples: list[np.ndarray]) -> dict[str, np.ndarray]:
    longest = max(len(s) for s in samples)
    ids = zeros((len(samples), longest), np.int64)
    lengths = empty(len(samples), np.int32)
    for row, sample in enumerate(samples):
        ids[row, : len(sample)] = sample
        lengths[row] = len(sample)
    # Where its memory came from: a view of something else (the slot), or its own.
    in_slot = np.array([not ids.flags.owndata and not lengths.flags.owndata])
    return {"ids": ids, "lengths": lengths, "in_slot": in_slot}


def _expected(first: int, size: int) -> np.ndarray:
    samples = [Documents()[i] for i in range(first, first + size)]
    out = np.zeros((size, max(map(len, samples))), np.int64)
    for row, sample in enumerate(samples):
        out[row, : len(sample)] = sample
    return out


def _check(loader: Any) -> list[bool]:
    where = []
    for number, batch in enumerate(loader):
        np.testing.assert_array_equal(batch["ids"], _expected(number * 5, len(batch["ids"])))
        assert batch["lengths"].tolist() == [_length(i) for i in range(number * 5, number * 5 + 5)]
        where.append(bool(batch["in_slot"][0]))
    assert len(where) == 200  # (a worker fills each of its slots many times over)
    return where


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_workers_collate_makes_its_arrays_in_the_slot_and_they_arrive_zeroed(method: str) -> None:
    loader = conveyor.DataLoader(
        Documents(), batch_size=5, num_workers=2, collate_fn=padding,
        multiprocessing_context=method, persistent_workers=True,
    )  # fmt: skip
    for _ in range(2):  # the second epoch refills slots that held the first one's batches
        assert all(_check(loader))


@pytest.mark.parametrize(
    "workers",
    [{"num_workers": 0}, {"num_workers": 2, "worker_method": "thread"}],
    ids=["in-process", "threads"],
)
def test_without_process_workers_they_are_numpys_own(workers: dict[str, Any]) -> None:
    loader = conveyor.DataLoader(Documents(), batch_size=5, collate_fn=padding, **workers)
    assert not any(_check(loader))


def test_outside_a_loader_they_are_numpys_empty_and_zeros() -> None:
    made = zeros((2, 3), "float32")
    assert made.flags.owndata and made.dtype == np.float32 and not made.any()
    assert empty(4, np.int16).shape == (4,) and empty((2, 2)).dtype == np.float64
