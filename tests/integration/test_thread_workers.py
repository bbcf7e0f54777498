"""Thread workers (``worker_method="thread"``): the same guarantees as process workers,
or a clear word at construction where a thread cannot give them.

Batches, order and sharding against torch are in tests/parity (the conformance table
runs for threads too); resume across worker methods in tests/resume.
"""

from __future__ import annotations

import gc
import threading
import warnings
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor import (
    ConfigError,
    DataLoader,
    WorkerStallWarning,
    WorkerTimeoutError,
    get_worker_info,
)

pytestmark = pytest.mark.timeout(120)


def _conveyor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("conveyor-worker-")]


@pytest.fixture(autouse=True)
def no_thread_left_behind() -> Any:
    before = _conveyor_threads()
    yield
    left = [t for t in _conveyor_threads() if t not in before]
    if left:  # an iterator kept by an exception's traceback: gone once collected
        gc.collect()
    for thread in left:
        thread.join(10)
    assert not [t for t in left if t.is_alive()], "a worker thread outlived its loader"


class Numbers:
    def __init__(self, n: int = 24, bad: tuple[int, ...] = ()) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i in self.bad:
            raise ValueError(f"sample {i} is corrupt")
        info = get_worker_info()
        assert info is not None
        return {"i": i, "worker": info.id, "thread": threading.current_thread().name}


def _loader(dataset: Any, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 3)
    kwargs.setdefault("num_workers", 3)
    return DataLoader(dataset, worker_method="thread", **kwargs)


def test_each_thread_has_its_own_worker_info() -> None:
    seen = {}
    for batch in _loader(Numbers()):
        for i, worker, thread in zip(batch["i"].tolist(), batch["worker"].tolist(),
                                     batch["thread"], strict=True):  # fmt: skip
            seen[i] = (worker, thread)
    assert sorted(seen) == list(range(24))
    for worker, thread in seen.values():
        assert thread == f"conveyor-worker-{worker}"
    assert {worker for worker, _ in seen.values()} == {0, 1, 2}
    assert get_worker_info() is None  # the training thread is no worker


def test_batches_are_handed_over_without_a_copy() -> None:
    """The array a worker thread made is the array the loop gets."""
    made: dict[int, int] = {}

    class Remembers:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> Any:
            return i

    def collate(samples: list[int]) -> np.ndarray:
        batch = np.array(samples)
        made[samples[0]] = id(batch)
        return batch

    got = {int(b[0]): id(b) for b in _loader(Remembers(), batch_size=2, collate_fn=collate)}
    assert got == made


def test_on_error_skip_leaves_the_bad_samples_out_within_the_budget() -> None:
    loader = _loader(Numbers(bad=(4, 17)), on_error="skip", max_errors=2)
    got = [i for batch in loader for i in batch["i"].tolist()]
    assert got == [i for i in range(24) if i not in (4, 17)]
    assert [s.index for s in loader.skipped_samples] == [4, 17]
    with pytest.raises(ValueError, match="sample 9 is corrupt"):
        list(_loader(Numbers(bad=(4, 9)), on_error="skip", max_errors=1))


def test_an_error_keeps_its_type_and_names_the_worker() -> None:
    with pytest.raises(ValueError, match="sample 7 is corrupt") as caught:
        list(_loader(Numbers(bad=(7,))))
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "DataLoader worker" in notes and "fetch" in notes


def test_worker_init_fn_runs_in_each_thread_with_its_dataset() -> None:
    started: dict[int, str] = {}

    def init(worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None and info.id == worker_id and info.worker_method == "thread"
        started[worker_id] = threading.current_thread().name

    list(_loader(Numbers(), worker_init_fn=init))
    assert started == {i: f"conveyor-worker-{i}" for i in range(3)}


class Shards(conveyor.IterableDataset):
    """torch's sharding pattern: worker_init_fn sets this worker's range on its dataset."""

    def __init__(self) -> None:
        self.start, self.end = 0, 30

    def __iter__(self) -> Any:
        return iter(range(self.start, self.end))


def _split(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    share = 30 // info.num_workers
    info.dataset.start, info.dataset.end = worker_id * share, (worker_id + 1) * share


def test_an_iterable_dataset_shards_through_get_worker_info() -> None:
    """Each thread worker has a dataset of its own (a shallow copy), as a process has."""
    got = [i for batch in _loader(Shards(), worker_init_fn=_split) for i in batch.tolist()]
    assert sorted(got) == list(range(30))


def test_persistent_workers_keep_their_threads_across_epochs() -> None:
    loader = _loader(Numbers(), persistent_workers=True)
    first = {t for batch in loader for t in batch["thread"]}
    idents = {t.ident for t in _conveyor_threads()}
    second = {t for batch in loader for t in batch["thread"]}
    assert first == second == {f"conveyor-worker-{i}" for i in range(3)}
    assert {t.ident for t in _conveyor_threads()} == idents
    del loader


def test_per_worker_resources_are_per_thread() -> None:
    class Opens:
        def __init__(self) -> None:
            self.resource = conveyor.per_worker(object)

        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int) -> Any:
            return id(self.resource.get()), get_worker_info().id  # type: ignore[union-attr]

    pairs = {
        (r, w)
        for resources, workers in _loader(Opens(), batch_size=2)
        for r, w in zip(resources.tolist(), workers.tolist(), strict=True)
    }
    assert len({r for r, _ in pairs}) == 3  # one resource per worker...
    assert len(pairs) == 3  # ... used by that worker alone


def test_multiprocessing_context_is_refused_with_threads() -> None:
    with pytest.raises(ConfigError, match="no meaning with worker_method='thread'"):
        _loader(Numbers(), multiprocessing_context="spawn")


class Hangs:
    """Sample 4 waits until the test lets it go (a real hang: the thread blocks)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 4:
            self.release.wait(60)
        return i


def test_a_hung_thread_is_reported_with_its_stack() -> None:
    """The stall warning (at 0.3 s) comes while the loop waits, before the timeout."""
    dataset = Hangs()
    loader = _loader(dataset, batch_size=2, num_workers=2, stall_warning=0.3, timeout=1.5)
    try:
        with pytest.warns(WorkerStallWarning) as record, pytest.raises(WorkerTimeoutError):
            list(loader)
    finally:
        dataset.release.set()  # the stuck thread cannot be killed: let it finish
    text = str(record[0].message)
    assert "[4, 5]" in text
    assert "__getitem__" in text and "self.release.wait(60)" in text  # the thread's stack


def test_a_timeout_names_the_sample_and_shows_the_threads_stack() -> None:
    dataset = Hangs()
    loader = _loader(dataset, batch_size=2, num_workers=2, timeout=0.5)
    try:
        with pytest.raises(WorkerTimeoutError) as caught:
            list(loader)
    finally:
        dataset.release.set()  # the stuck thread cannot be killed: let it finish
    text = str(caught.value)
    assert "[4, 5]" in text and "release.wait" in text


def test_no_pre_flight_check_about_processes_fires_for_threads() -> None:
    """An open file shared by forked workers is a hazard; threads share it by design
    (each should still open its own: per_worker), and nothing is pickled."""

    class HoldsALambda:
        def __init__(self) -> None:
            self.transform = lambda x: x * 2  # spawn could not pickle a plain-pickle lambda

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            return int(self.transform(i))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [b.tolist() for b in _loader(HoldsALambda(), batch_size=2, num_workers=8)]
    assert got == [[0, 2], [4, 6]]
