"""What the training loop calls on the dataset between epochs reaches every worker's copy:
``dataset.set_epoch(epoch)`` before each epoch, with persistent workers (which keep the
copy they started with) and without, on every kind of worker; once per worker per epoch,
never mid-epoch; before an iterable dataset's iterator is made; and in a run resumed from
a state taken mid-epoch.

torch's loader, and conveyor's before issue 42, gave ``[[0], [0], [0]]`` for the first
test: every epoch the first one's. A replacement after a real SIGKILL is in
tests/faults/test_epoch_calls_after_a_crash.py, Ray actors in tests/remote, Hugging Face
``datasets``' own ``set_epoch`` in tests/frameworks/test_data_libraries.py.
"""

from __future__ import annotations

import collections
import json
import random
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader, IterableDataset, get_worker_info
from tests.helpers.leaks import no_leaks
from tests.resume.datasets import seeded

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

EPOCHS = 3


class Epochs:
    """Sample i: ``[the epoch this copy was told, i, the worker serving it]``. Each call
    made on a worker's copy is logged, one line ``"<worker id> <epoch>"``, to ``log``."""

    def __init__(self, n: int = 8, log: str | None = None, fail_at: int | None = None) -> None:
        self.n = n
        self.epoch = 0
        self.log = log
        self.fail_at = fail_at

    def set_epoch(self, epoch: int) -> None:
        info = get_worker_info()
        if info is not None and epoch == self.fail_at:
            raise KeyError(f"no shuffle for epoch {epoch} in worker {info.id}")
        self.epoch = epoch
        if info is not None and self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{info.id} {epoch}\n")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        info = get_worker_info()
        return np.array([self.epoch, i, info.id if info is not None else -1])


class EpochStream(IterableDataset):  # type: ignore[misc]
    """Each worker's share of ``range(n)``, each item ``[epoch, i]``, the epoch read once,
    when the iterator is made (as a shuffle seeded by the epoch would be)."""

    def __init__(self, n: int = 12) -> None:
        self.n = n
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        info = get_worker_info()
        epoch, start, step = self.epoch, info.id, info.num_workers
        return iter([np.array([epoch, i]) for i in range(start, self.n, step)])


FORK, THREAD = {"multiprocessing_context": "fork"}, {"worker_method": "thread"}
# The kinds of worker, and start methods; each of 2 workers (processes of 2 threads: 4).
KINDS = [
    pytest.param(FORK, 2, id="fork"),
    pytest.param(
        {"multiprocessing_context": "forkserver"}, 2, id="forkserver", marks=pytest.mark.slow
    ),
    pytest.param({"multiprocessing_context": "spawn"}, 2, id="spawn"),  # slow: conftest.py
    pytest.param(THREAD, 2, id="thread"),
    pytest.param({"multiprocessing_context": "fork", "threads_per_worker": 2}, 4, id="fork-cores"),
]


def _rows(batches: Iterable[Any]) -> np.ndarray:
    """The batches' rows, copied as each comes (a batch is a view of its worker's memory)."""
    return np.concatenate([np.asarray(b).copy() for b in batches])


def _calls_made(log: Path) -> collections.Counter[tuple[int, int]]:
    lines = log.read_text().split() if log.exists() else []
    return collections.Counter(zip(map(int, lines[::2]), map(int, lines[1::2]), strict=True))


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch"])
@pytest.mark.parametrize(("kind", "cores"), KINDS)
def test_each_epoch_reaches_every_workers_copy_once(
    kind: dict[str, Any], cores: int, persistent: bool, tmp_path: Path
) -> None:
    log = tmp_path / "calls"
    dataset = Epochs(log=str(log))
    loader = DataLoader(dataset, num_workers=2, persistent_workers=persistent, **kind)
    seen, served = [], []
    with no_leaks():
        for epoch in range(EPOCHS):
            dataset.set_epoch(epoch)
            rows = _rows(loader)
            seen.append(sorted(set(rows[:, 0].tolist())))
            served.append(set(rows[:, 2].tolist()))
        del loader
    assert seen == [[0], [1], [2]]
    assert served == [set(range(cores))] * EPOCHS
    # Each worker's copy was told once an epoch: as it started, or as the epoch did.
    assert _calls_made(log) == {(w, e): 1 for w in range(cores) for e in range(EPOCHS)}


@pytest.mark.parametrize(("kind", "cores"), [KINDS[0], KINDS[3]])
def test_a_call_made_mid_epoch_reaches_the_workers_as_the_next_epoch_starts(
    kind: dict[str, Any], cores: int, tmp_path: Path
) -> None:
    log = tmp_path / "calls"
    dataset = Epochs(n=16, log=str(log))
    loader = DataLoader(dataset, num_workers=2, persistent_workers=True, **kind)
    with no_leaks():
        dataset.set_epoch(1)
        it = iter(loader)
        first = _rows([next(it)])
        dataset.set_epoch(5)  # while workers fetch epoch 1: not for them now
        this_epoch = np.concatenate([first, _rows(it)])
        next_epoch = _rows(loader)  # no call before it: the last one made
        del it, loader
    assert set(this_epoch[:, 0].tolist()) == {1}
    assert set(next_epoch[:, 0].tolist()) == {5}
    assert _calls_made(log) == {(w, e): 1 for w in range(cores) for e in (1, 5)}


@pytest.mark.parametrize(("kind", "cores"), [KINDS[0], KINDS[3], KINDS[4]])
def test_an_iterable_dataset_is_told_before_each_workers_iterator_is_made(
    kind: dict[str, Any], cores: int
) -> None:
    dataset = EpochStream()
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True, **kind)
    epochs = []
    with no_leaks():
        for epoch in range(EPOCHS):
            dataset.set_epoch(epoch)
            rows = _rows(np.asarray(b)[None] for b in loader)
            assert sorted(rows[:, 1].tolist()) == list(range(12))  # each item once
            epochs.append(sorted(set(rows[:, 0].tolist())))
        del loader
    assert epochs == [[0], [1], [2]]


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch"])
def test_a_call_that_raises_in_a_worker_is_raised_with_its_type(persistent: bool) -> None:
    dataset = Epochs(fail_at=1)
    loader = DataLoader(dataset, num_workers=2, persistent_workers=persistent)
    with no_leaks():
        dataset.set_epoch(0)
        assert sum(1 for _ in loader) == 8
        dataset.set_epoch(1)  # fine here; raises in each worker
        with pytest.raises(KeyError, match="no shuffle for epoch 1 in worker") as raised:
            for _ in loader:
                pass
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        del raised, loader  # (its traceback holds the iterator)
    assert "fetch" in notes and "set_epoch" in notes  # the stage, and the worker's traceback


class WaitingEpochs(Epochs):
    """Each sample waits 4 ms (storage stands in): ``num_workers="auto"`` adds workers."""

    def __getitem__(self, i: int) -> np.ndarray:
        threading.Event().wait(0.004)
        return super().__getitem__(i)


@pytest.mark.parametrize("kind", [THREAD, FORK], ids=["thread", "fork"])
def test_a_worker_the_autotuner_adds_serves_the_epoch_the_others_serve(
    kind: dict[str, Any], tmp_path: Path
) -> None:
    """Added mid-epoch, after the training loop told the main process's dataset of the
    next epoch: its copy (of the dataset as it is then) is told of this one first."""
    dataset = WaitingEpochs(n=1200)
    with no_leaks():
        loader = DataLoader(dataset, batch_size=4, num_workers="auto", **kind)
        started = loader.num_workers
        dataset.set_epoch(1)
        it = iter(loader)
        first = _rows([next(it)])
        dataset.set_epoch(9)  # for the next epoch
        rows = np.concatenate([first, _rows(it)])
        stats = loader.statistics()
        del it, loader
    assert stats is not None and len(stats.workers) > started, "no worker was added"
    assert len(set(rows[:, 2].tolist())) > started  # and the added ones served samples
    assert set(rows[:, 0].tolist()) == {1}


class SeedsGlobals(Epochs):
    """A set_epoch that seeds the process's generators (``random.seed(epoch)``); samples
    are ``[epoch, i, worker, a draw from random, a draw from NumPy's module]``."""

    def set_epoch(self, epoch: int) -> None:
        random.seed(epoch)
        np.random.seed(epoch)
        self.epoch = epoch

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([*super().__getitem__(i), random.random(), np.random.rand()])


@pytest.mark.parametrize("kind", [FORK, THREAD], ids=["fork", "thread"])
def test_a_replayed_call_changes_the_copy_not_the_workers_random_streams(
    kind: dict[str, Any],
) -> None:
    """A worker's draws are seeded per worker, as torch seeds them; the call the loop
    replays changes its copy of the dataset, and its draws are those of a worker that
    was never told (a worker started afresh each epoch, as torch's are)."""

    def run(epoch_calls: tuple[str, ...]) -> np.ndarray:
        dataset = SeedsGlobals()
        loader = DataLoader(
            dataset, num_workers=2, generator=seeded(5), epoch_calls=epoch_calls, **kind
        )
        epochs = []
        for epoch in range(2):
            dataset.set_epoch(epoch)
            epochs.append(_rows(loader))
        return np.concatenate(epochs)

    with no_leaks():
        told, untold = run(("set_epoch",)), run(())
    assert told[:, 0].tolist() == [0] * 8 + [1] * 8
    assert told.tolist() == untold.tolist()
    worker_0, worker_1 = (told[told[:, 2] == w][:, 3:] for w in (0, 1))
    assert worker_0.tolist() != worker_1.tolist()  # each worker its own draws


def test_a_dataset_without_the_method_is_left_as_it_is() -> None:
    class Plain:
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            return i

    dataset = Plain()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True)
    with no_leaks():
        for _ in range(2):
            assert [int(x) for b in loader for x in b] == list(range(8))
        state = loader.state_dict()
        del loader
    assert vars(dataset) == {} and "calls" not in state["conveyor"]


# --- resumed from a state taken mid-epoch 2 ----------------------------------------------


def _run_until_epoch_2(kind: dict[str, Any]) -> tuple[dict[str, Any], np.ndarray]:
    """The uninterrupted run: epochs 0 and 1, then 3 batches of epoch 2, the state taken
    there (through JSON, as a checkpoint file), then the rest of epoch 2."""
    dataset = Epochs(n=16)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True, **kind)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        for _ in loader:
            pass
    dataset.set_epoch(2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = _rows(it)
    del it, loader
    return state, rest


@pytest.mark.parametrize(
    ("kind", "resumed"),
    [
        pytest.param(FORK, {"num_workers": 2, **FORK}, id="fork"),
        pytest.param(FORK, {"num_workers": 3, **FORK}, id="fork-other-count"),
        pytest.param(THREAD, {"num_workers": 2, **THREAD}, id="thread"),
        pytest.param(THREAD, {"num_workers": 2, **FORK}, id="thread-to-fork"),
        pytest.param(FORK, {"num_workers": 0}, id="fork-to-in-process"),
        pytest.param(
            {"multiprocessing_context": "spawn"},
            {"num_workers": 2, "multiprocessing_context": "spawn"},
            id="spawn",
        ),
    ],
)
def test_a_run_resumed_mid_epoch_2_sees_epoch_2(
    kind: dict[str, Any], resumed: dict[str, Any]
) -> None:
    with no_leaks():
        state, rest = _run_until_epoch_2(kind)
        dataset = Epochs(n=16)  # a new process: the dataset as it is made, epoch 0
        persistent = resumed["num_workers"] > 0
        loader = DataLoader(dataset, batch_size=2, persistent_workers=persistent, **resumed)
        loader.load_state_dict(state)  # and no set_epoch(2): the state says it
        again = _rows(loader)
        dataset.set_epoch(3)
        after = _rows(loader)
        del loader
    assert again[:, :2].tolist() == rest[:, :2].tolist()
    assert set(again[:, 0].tolist()) == {2}
    assert set(after[:, 0].tolist()) == {3} and len(after) == 16
    assert state["conveyor"]["calls"] == [{"name": "set_epoch", "args": [2], "kwargs": {}}]
