"""A worker that replaces one killed mid-epoch (a real SIGKILL) makes the epoch's calls on
its copy of the dataset before its first task: it serves the epoch the others serve, not
the one its copy was made with (a fork or a fresh pickle of the main process's dataset as
it is now, told meanwhile of the *next* epoch).

torch's loader, and conveyor's before issue 42, served epoch 0 from the survivor and the
main process's latest epoch from the replacement.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader, WorkerRestartedWarning, get_worker_info

pytestmark = pytest.mark.timeout(180)


class Epochs:
    """Sample i: ``[the epoch this copy was told, i, the pid serving it]``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        assert get_worker_info() is not None
        return np.array([self.epoch, i, os.getpid()])


def _rows(batches: Iterable[Any]) -> np.ndarray:
    """The batches' rows, copied as each comes (a batch is a view of its worker's memory)."""
    return np.concatenate([np.asarray(b).copy() for b in batches])


@pytest.mark.parametrize("cores", [1, 2], ids=["processes", "processes-of-2-threads"])
def test_a_replacement_serves_the_epoch_the_others_serve(start_method: str, cores: int) -> None:
    dataset = Epochs(n=24)
    loader = DataLoader(
        dataset,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=start_method,
        threads_per_worker=cores,
        run_ahead=False,  # tasks are out two a worker: the replacement gets some of the epoch
    )
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        assert set(_rows(loader)[:, 0].tolist()) == {epoch}
    dataset.set_epoch(2)
    it = iter(loader)
    first = _rows([next(it)])
    dataset.set_epoch(7)  # for the next epoch: the replacement's copy is made with it
    before = {w.pid for w in it._workers}
    os.kill(it._workers[0].pid, signal.SIGKILL)
    with pytest.warns(WorkerRestartedWarning, match="SIGKILL"):
        rows = np.concatenate([first, _rows(it)])
    assert sorted(rows[:, 1].tolist()) == list(range(24))  # each sample once
    replacements = set(rows[:, 2].tolist()) - before
    assert replacements, "no batch of the epoch came from the replacement"
    assert set(rows[:, 0].tolist()) == {2}
    assert set(_rows(loader)[:, 0].tolist()) == {7}  # the next epoch: the last call
    del it, loader
