"""A large batch's slot goes back to its worker as soon as the batch is garbage (issue 40),
in a frame of its own, not with the worker's next task: that task goes out only once the
worker's last batch is handed out, and by then the worker has begun another batch, in a
slot it had to add. Small slots still ride the next task (a frame each costs the main
process a system call, and saves nothing worth it)."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import numpy as np

from conveyor import DataLoader
from conveyor._workers.pool import RELEASE_EARLY_BYTES


class Blocks:
    """Samples of ``nbytes`` each (batches of 2), each taking a millisecond: batches too
    slow to run ahead, so each worker has its ``prefetch_factor`` tasks and no more. Those
    from index 6 on (the fourth batch, worker 1's second task, and every later one) wait
    for ``gate``: a worker's tasks stay unanswered for as long as the test looks, however
    slow the machine."""

    def __init__(self, nbytes: int, gate: Any, n: int = 64) -> None:
        self.nbytes, self.gate, self.n = nbytes, gate, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(0.001)
        if i >= 6:
            self.gate.wait(60)
        return np.full(self.nbytes // 4, i, dtype=np.float32)


def _pending_after_the_next_batch(nbytes: int) -> tuple[list[int], list[int]]:
    """Hand out a batch, drop it, hand out the next: what the first one's worker still
    has pending, and its tasks unanswered before that second hand-out."""
    context = multiprocessing.get_context("fork")
    gate = context.Event()
    loader = DataLoader(
        Blocks(nbytes, gate), batch_size=2, num_workers=2, multiprocessing_context=context
    )
    it: Any = iter(loader)
    try:
        next(it)  # (the first batch's slots are mapped now)
        batch = next(it)  # from worker 1, whose next tasks wait for the gate
        del batch
        worker = it._pool._workers[1]
        unanswered = [worker.unanswered]
        next(it)  # worker 0's: the task it dispatches goes to worker 0, not to worker 1
        return list(worker.pending_releases), unanswered
    finally:
        gate.set()
        it.close()


def test_a_large_slot_goes_back_at_once_though_its_worker_has_tasks() -> None:
    pending, unanswered = _pending_after_the_next_batch(2 * RELEASE_EARLY_BYTES)
    assert unanswered[0] > 0  # nothing but the early release would send it now
    assert pending == []


def test_a_small_slot_waits_for_its_workers_next_task() -> None:
    pending, unanswered = _pending_after_the_next_batch(4096)
    assert unanswered[0] > 0
    assert len(pending) == 1
