"""``pin_memory=True`` with real workers and shared-memory slots, pinned one batch ahead.

No accelerator is needed: the loop is told one exists and pins with a stand-in that
copies the batch (as pinning does, into other memory) from the pinning thread, while
this thread keeps receiving and decoding batches over the slots. What is checked is
the transport's side: every batch arrives whole and once, a slot is never reused
while the pin thread still reads it, and nothing is left behind.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor._iter import multiprocess
from conveyor._iter.pin_ahead import THREAD_NAME
from tests.helpers.leaks import no_leaks


class Rows:
    """Sample ``i`` is 4,096 copies of ``i`` (32 KiB): every batch travels in a slot."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(4096, index, dtype=np.int64)


class CopyPinner:
    """Copies the batch, as pinning does; counts the batches pinned in the pin thread."""

    def __init__(self) -> None:
        self.ahead = 0

    def __call__(self, batch: Any) -> Any:
        if threading.current_thread().name.startswith(THREAD_NAME):
            self.ahead += 1
        return copy.deepcopy(batch)


@pytest.fixture
def pinner(monkeypatch: pytest.MonkeyPatch) -> CopyPinner:
    pin = CopyPinner()
    monkeypatch.setattr(multiprocess, "pinning_enabled", lambda config: True)
    monkeypatch.setattr(multiprocess, "pin_batch", pin)
    monkeypatch.setattr(multiprocess, "pin_thread_setup", lambda: None)
    return pin


def _rows_hold_their_index(batch: Any) -> list[int]:
    array = np.asarray(batch)
    first = array[:, :1]
    assert (array == first).all(), "a batch changed while it was pinned"
    return [int(i) for i in first[:, 0]]


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_batches_pinned_ahead_arrive_whole_and_once_across_a_break(
    method: str, pinner: CopyPinner
) -> None:
    with no_leaks():
        loader = conveyor.DataLoader(
            Rows(), batch_size=4, num_workers=2, pin_memory=True,
            persistent_workers=True, multiprocessing_context=method,
        )  # fmt: skip
        seen = []
        for batch in loader:  # a break mid-epoch with a batch pinned ahead...
            seen += _rows_hold_their_index(batch)
            if len(seen) == 40:
                break
        assert seen == list(range(40))
        # ...and the next epoch, on the same workers, is whole.
        assert [i for batch in loader for i in _rows_hold_their_index(batch)] == list(range(96))
        assert pinner.ahead > 0
        del loader, batch
