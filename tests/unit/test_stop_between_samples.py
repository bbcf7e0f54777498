"""A worker told to stop abandons its batch at the next sample boundary.

The interpreter's exit (thread workers) and teardown (every kind) tell a worker to stop:
it must not run the rest of the batch it is building, which with slow samples is a
batch's time where one sample's is all it may take. The runner asks its watcher before
each sample and before collating, on every path a task can take (streamed into rows,
fetched at once, one by one, under ``on_error="skip"``, from an iterable dataset).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor import DataLoader
from conveyor._task.outcomes import Abandoned, Collated
from conveyor._task.protocol import Ready, Stage, Task
from conveyor._task.runner import TaskRunner
from conveyor._workers.core import STOP, WorkerCore
from conveyor._workers.spec import UserObjects, WorkerSpec
from conveyor._workers.status import MemoryStatus, StatusWriter, mark_starting, request_stop
from conveyor.collate import default_collate

BATCH = [0, 1, 2, 3]


class StopAt:
    """The watcher: told to stop once the dataset has fetched the sample at ``at``."""

    def __init__(self) -> None:
        self.stopped = False
        self.stop_check = lambda: self.stopped

    def stage(self, stage: Stage) -> None:
        pass

    def position(self, position: int) -> None:
        pass


class Samples:
    """Map-style: fetching sample ``stop_at`` tells the watcher to stop (as the exit does
    while a thread is in that sample)."""

    def __init__(self, watcher: StopAt, stop_at: int) -> None:
        self.watcher = watcher
        self.stop_at = stop_at
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        self.fetched.append(index)
        if index == self.stop_at:
            self.watcher.stopped = True
        return index


class Stream(Samples):
    """Iterable-style, the same samples in order."""

    def __iter__(self) -> Iterator[int]:
        return (self[i] for i in range(len(self)))


def _collate_seen(seen: list[Any]) -> Any:
    def collate(samples: list[Any]) -> Any:
        seen.append(samples)
        return samples

    return collate


PATHS = {
    "streamed into rows": {"collate": default_collate},
    "fetched at once": {},
    "one by one (traced)": {"trace": True},
    "under on_error='skip'": {"skip_errors": True},
    "with samples excluded": {"exclude": (2,)},
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("stop_at", [1, 3])  # mid-batch; at the last sample: no collate
def test_the_batch_is_abandoned_at_the_next_sample(path: str, stop_at: int) -> None:
    options = PATHS[path]
    watcher = StopAt()
    dataset = Samples(watcher, stop_at)
    seen: list[Any] = []
    runner = TaskRunner(
        dataset,
        iterable=False,
        auto_collation=True,
        collate_fn=options.get("collate", _collate_seen(seen)),  # type: ignore[arg-type]
        drop_last=False,
        skip_errors=bool(options.get("skip_errors", False)),
    )
    exclude: tuple[Any, ...] = options.get("exclude", ())  # type: ignore[assignment]
    outcome = runner.run(BATCH, exclude=exclude, trace=bool(options.get("trace")), watcher=watcher)
    assert isinstance(outcome, Abandoned), outcome
    assert dataset.fetched == [i for i in BATCH if i <= stop_at and i not in exclude]
    assert seen == []  # nothing was collated


def test_an_iterable_datasets_batch_is_abandoned_at_the_next_item() -> None:
    watcher = StopAt()
    dataset = Stream(watcher, 1)
    seen: list[Any] = []
    runner = TaskRunner(
        dataset, iterable=True, auto_collation=True, collate_fn=_collate_seen(seen),
        drop_last=False, skip_errors=False,
    )  # fmt: skip
    assert isinstance(runner.run(BATCH, watcher=watcher), Abandoned)
    assert dataset.fetched == [0, 1] and seen == []


def test_a_runner_not_told_to_stop_runs_the_whole_batch() -> None:
    watcher = StopAt()
    dataset = Samples(watcher, stop_at=-1)
    runner = TaskRunner(
        dataset, iterable=False, auto_collation=True, collate_fn=default_collate,
        drop_last=False, skip_errors=False,
    )  # fmt: skip
    outcome = runner.run(BATCH, watcher=watcher)
    assert isinstance(outcome, Collated) and dataset.fetched == BATCH


def test_a_core_told_to_stop_mid_task_answers_nothing_and_ends() -> None:
    status = MemoryStatus()

    class StopsItsCore:
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> int:
            if index == 1:
                status.stopping = True  # as ThreadPool's stop() does, from another thread
            return index

    spec = WorkerSpec(
        worker_id=0, num_workers=1, base_seed=0, iterable=False, auto_collation=True,
        drop_last=False, worker_method="thread",
    )  # fmt: skip
    user = UserObjects(StopsItsCore(), default_collate, None)
    core = WorkerCore(spec, user, _Reference(), status, owns_process=False)
    assert isinstance(core.start(), Ready)
    assert core.handle(Task(0, 0, BATCH)) is STOP
    core.close()


class _Reference:
    arrays_as_tensors = False

    def collating(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def encode(self, batch: Any) -> Any:
        return batch


class HeldAt:
    """Sample ``held`` waits until the test lets it go; ``entered`` says a thread is in it."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.entered = threading.Event()
        self.go = threading.Event()
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        if index == self.held:
            self.entered.set()
            self.go.wait(30)
        self.fetched.append(index)
        return index


def test_a_thread_worker_closed_mid_batch_runs_no_further_sample_of_it() -> None:
    dataset = HeldAt(held=1)
    loader = DataLoader(dataset, batch_size=4, num_workers=1, worker_method="thread")
    it = iter(loader)
    assert dataset.entered.wait(30)
    stuck = [t for t in threading.enumerate() if t.name == "conveyor-worker-0"]
    it._shutdown_workers()  # type: ignore[attr-defined]  # the thread is told to stop
    dataset.go.set()  # sample 1 returns: the thread must not go on to 2 and 3
    for thread in stuck:
        thread.join(30)
    assert not any(thread.is_alive() for thread in stuck)
    assert dataset.fetched == [0, 1]


def test_the_status_pages_stop_check_sees_the_main_processs_request() -> None:
    """The check the fetch loop makes before each sample reads what teardown writes:
    the STOP field of a process worker's page, a thread worker's ``stopping``."""
    page = memoryview(bytearray(4096))
    mark_starting(page)
    writer = StatusWriter(page)
    assert writer.stop_check is not None and not writer.stop_check()
    request_stop(page)
    assert writer.stop_check() and writer.stop_requested()
    memory = MemoryStatus()
    assert not memory.stop_check()
    memory.stopping = True
    assert memory.stop_check()
