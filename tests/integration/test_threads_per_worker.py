"""Worker processes of several cores in threads (``threads_per_worker``): each core is a
worker to the user (its own ``get_worker_info()``, seed, dataset copy, shard and
``per_worker`` handles), the process is torch's worker to code that reads
``iterator._workers``, and a bad combination is refused at construction.

Batches against torch are in tests/parity (``test_cores_in_threads_give_torchs_batches``),
resume across methods in tests/resume, real crashes and hangs in tests/faults.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor import ConfigError, DataLoader, get_worker_info

pytestmark = pytest.mark.timeout(120)

PROCESSES, THREADS = 2, 3  # 6 cores


class WhoServes:
    def __init__(self, n: int = 36, bad: tuple[int, ...] = ()) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i in self.bad:
            raise ValueError(f"sample {i} is corrupt")
        info = get_worker_info()
        assert info is not None
        return {
            "i": i,
            "worker": info.id,
            "of": info.num_workers,
            "seed": info.seed,
            "method": info.worker_method,
            "pid": os.getpid(),
            "thread": threading.get_ident(),
            "own_dataset": id(info.dataset),
        }


def _loader(dataset: Any, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 2)
    kwargs.setdefault("num_workers", PROCESSES)
    kwargs.setdefault("multiprocessing_context", "fork")
    return DataLoader(dataset, threads_per_worker=THREADS, **kwargs)


def _samples(loader: DataLoader) -> list[dict[str, Any]]:
    found = []
    for batch in loader:
        columns = {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in batch.items()}
        rows = zip(*columns.values(), strict=True)
        found += [dict(zip(columns, row, strict=True)) for row in rows]
    return found


def test_each_core_is_a_worker_of_its_own_in_a_thread_of_one_of_the_processes() -> None:
    samples = _samples(_loader(WhoServes()))
    assert [s["i"] for s in samples] == list(range(36))  # in order, each once
    cores = {s["worker"]: s for s in samples}
    assert sorted(cores) == list(range(PROCESSES * THREADS))
    assert {s["of"] for s in samples} == {PROCESSES * THREADS}
    assert {s["method"] for s in samples} == {"thread"}  # it shares its process
    assert len({s["seed"] for s in cores.values()}) == PROCESSES * THREADS
    by_process: dict[int, set[int]] = {}
    for s in samples:
        by_process.setdefault(s["pid"], set()).add(s["worker"])
    assert len(by_process) == PROCESSES and os.getpid() not in by_process
    assert all(len(workers) == THREADS for workers in by_process.values())
    # One thread and one dataset object per core, whichever sample it served.
    assert len({(s["pid"], s["thread"]) for s in samples}) == PROCESSES * THREADS
    assert all(
        {(s["thread"], s["own_dataset"]) for s in samples if s["worker"] == w}
        == {(cores[w]["thread"], cores[w]["own_dataset"])}
        for w in cores
    )


class GlobalDraws:
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[int, float]:
        return os.getpid(), float(np.random.random())


def test_each_process_seeds_its_shared_generators_differently() -> None:
    """The process-wide generators its threads share are seeded once per process, as
    its first worker's: two processes do not draw alike (their threads together cannot
    draw reproducibly: the docs point to get_worker_info().rng)."""
    drawn: dict[int, set[float]] = {}
    for pids, draws in _loader(GlobalDraws()):
        for pid, draw in zip(pids.tolist(), draws.tolist(), strict=True):
            drawn.setdefault(pid, set()).add(draw)
    assert len(drawn) == PROCESSES and os.getpid() not in drawn
    one, other = drawn.values()
    assert not one & other  # forked alike and left unseeded, they would draw the same


def test_iterator_workers_lists_the_processes() -> None:
    loader = _loader(WhoServes(), persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    handles = iterator._workers  # type: ignore[attr-defined]
    assert len(handles) == PROCESSES and all(h.is_alive() for h in handles)
    pids = {h.pid for h in handles}
    rest = _samples_of(iterator)
    assert {s["pid"] for s in rest} <= pids
    again = {s["pid"] for s in _samples(loader)}  # persistent: the same processes
    assert again <= pids


def _samples_of(iterator: Any) -> list[dict[str, Any]]:
    return [{"pid": pid} for batch in iterator for pid in batch["pid"].tolist()]


def test_worker_init_fn_runs_once_per_core_on_its_own_dataset() -> None:
    class Marks:
        def __init__(self) -> None:
            self.mark = -1

        def __len__(self) -> int:
            return 24

        def __getitem__(self, i: int) -> tuple[int, int]:
            info = get_worker_info()
            assert info is not None
            return info.id, info.dataset.mark

    def init(worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None and info.id == worker_id
        info.dataset.mark = worker_id  # its own copy: no other core sees it

    pairs = {
        (w, m)
        for workers, marks in _loader(Marks(), worker_init_fn=init)
        for w, m in zip(workers.tolist(), marks.tolist(), strict=True)
    }
    assert pairs == {(w, w) for w in range(PROCESSES * THREADS)}


class Shards(conveyor.IterableDataset):
    """torch's sharding pattern, through get_worker_info()."""

    def __iter__(self) -> Any:
        info = get_worker_info()
        assert info is not None
        return iter(range(info.id, 60, info.num_workers))


def test_an_iterable_dataset_is_sharded_across_every_core() -> None:
    got = [i for batch in _loader(Shards(), batch_size=4) for i in batch.tolist()]
    assert sorted(got) == list(range(60))


def test_on_error_skip_leaves_the_bad_samples_out_within_the_budget() -> None:
    loader = _loader(WhoServes(bad=(5, 30)), on_error="skip", max_errors=2)
    assert [s["i"] for s in _samples(loader)] == [i for i in range(36) if i not in (5, 30)]
    assert [s.index for s in loader.skipped_samples] == [5, 30]


def _columns(samples: list[tuple[Any, ...]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(zip(*samples, strict=True))


def test_per_worker_resources_are_per_core() -> None:
    class Opens:
        def __init__(self) -> None:
            self.resource = conveyor.per_worker(lambda: os.urandom(8).hex())

        def __len__(self) -> int:
            return 36

        def __getitem__(self, i: int) -> tuple[str, int]:
            info = get_worker_info()
            assert info is not None
            return self.resource.get(), info.id

    pairs = {
        (r, w)
        for resources, workers in _loader(Opens(), collate_fn=_columns)
        for r, w in zip(resources, workers, strict=True)
    }
    assert len(pairs) == len({r for r, _ in pairs}) == PROCESSES * THREADS


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"threads_per_worker": 0}, "threads_per_worker must be an int >= 1, got 0"),
        ({"threads_per_worker": True}, "threads_per_worker must be an int >= 1, got True"),
        ({"threads_per_worker": 2, "worker_method": "thread"}, "starts no worker process"),
        ({"threads_per_worker": 2, "num_workers": 0}, "num_workers=0 starts none"),
        ({"threads_per_worker": 2, "num_workers": "auto"}, "a worker is a process of several"),
    ],
)
def test_a_combination_that_cannot_work_is_refused_naming_the_fix(
    kwargs: dict[str, Any], words: str
) -> None:
    options = {"num_workers": 2, **kwargs}
    with pytest.raises(ConfigError, match=words):
        DataLoader(WhoServes(), **options)


def test_the_loader_keeps_its_arguments_as_given() -> None:
    loader = _loader(WhoServes())
    assert (loader.num_workers, loader.threads_per_worker) == (PROCESSES, THREADS)
    assert np.asarray(next(iter(loader))["of"]).tolist() == [6, 6]
