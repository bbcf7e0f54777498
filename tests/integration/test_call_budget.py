"""The main process's work per batch, counted in function calls (issue 40): a count, not a
time, so it holds on a busy machine and names what grew.

Two paths make up a batch's cost in the main process, each counted where it is exact:

* handing a batch out once its reply has come (the book, the next task sent, the batch
  rebuilt from its slot, the statistics): the same calls every batch;
* waiting for workers: a fixed part per wait (the pool's wait, one read of each pipe
  that is ready) and a part per reply filed (its frame parsed, its handle, the book).

The budgets sit a little above what conveyor makes today; the code before issue 40 made
55 Python calls to hand a batch out and 42 to wait for one reply, and fails both. Its
second round (the leaner hand-out) cut them from 31 to 28, and from 22 for a wait that
files one reply to 17 (a reply in a long run of them: from 11 calls to 6).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader
from conveyor_bench.calls import CallCount, count_calls

# Handing out a batch whose reply has come: Python calls, and all calls (C ones too).
HANDOUT_PYTHON, HANDOUT_ALL = 29, 66
# Waiting: Python calls for one wait that reads r pipes and files k replies, at most
# WAIT + r * PER_READ + k * PER_REPLY; and a reply in a slot the main process had not
# seen maps it (the run-ahead adds slots as it goes).
WAIT_PYTHON, PER_READ_PYTHON, PER_REPLY_PYTHON, PER_NEW_SLOT_PYTHON = 8, 5, 6, 9
_READS, _MAPS = "conveyor/_workers/frames.py:read", "conveyor/_transport/memfd.py:map_range"


class Rows:
    """A row of a small table and a label, as ``tiny``'s samples are."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.table = np.arange(64, dtype=np.float32).reshape(16, 4)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.table[i % 16], i % 10


@pytest.fixture
def iterator() -> Any:
    loader = DataLoader(
        Rows(16 * 4000),
        batch_size=16,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    it = iter(loader)
    for _ in range(50):  # the workers started, the run-ahead decided, every slot mapped
        next(it)
    yield it
    it.close()


def _replied(it: Any) -> int:
    return sum(1 for entry in it._book.view.entries() if entry.reply is not None)


def _unanswered(it: Any) -> int:
    return sum(1 for entry in it._book.view.entries() if entry.reply is None)


def _budget(count: CallCount, filed: int) -> float:
    """What a wait that filed ``filed`` replies may cost, given the pipes it read and the
    slots it mapped (as the count says)."""
    calls = dict(count.top)
    reads, maps = calls.get(_READS, 0.0), calls.get(_MAPS, 0.0)
    return (
        WAIT_PYTHON
        + PER_READ_PYTHON * reads
        + PER_REPLY_PYTHON * filed
        + PER_NEW_SLOT_PYTHON * maps
    )


def test_handing_out_a_batch_that_came_takes_a_fixed_few_calls(iterator: Any) -> None:
    it = iterator

    def until_the_next_batch_came() -> None:
        while it._book.peek() is None:
            it._receive()

    until_the_next_batch_came()
    count = count_calls(lambda: next(it), 300, between=until_the_next_batch_came)
    assert count.python <= HANDOUT_PYTHON and count.total <= HANDOUT_ALL, count.report()


def test_waiting_takes_a_fixed_few_calls_and_a_few_per_reply(iterator: Any) -> None:
    it = iterator
    seen: list[tuple[int, CallCount]] = []
    for _ in range(300):
        if it._book.peek() is not None:
            next(it)  # (not counted: keeps tasks in flight)
        if not _unanswered(it):
            continue
        before = _replied(it)
        count = count_calls(it._receive, 1)
        seen.append((_replied(it) - before, count))
    assert len(seen) > 100
    over = [
        f"{filed} replies in one wait:\n{count.report()}"
        for filed, count in seen
        if count.python > _budget(count, filed)
    ]
    assert not over, "\n".join(over[:3])
