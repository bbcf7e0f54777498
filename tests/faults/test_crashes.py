"""Workers that die or hang: a named error, and nothing left behind.

A dead worker is replaced and its tasks re-sent (``max_worker_restarts``, 3 by
default); a sample that kills its worker twice, a spent restart budget, or an
iterable-style dataset (whose iterator cannot be resumed) end in
``WorkerCrashedError``. Cases run under fork, spawn and forkserver (variants that
only differ in the exit status under fork and forkserver: see ``matrix``); the
autouse ``leak_check`` fixture (conftest.py) checks that no process, memfd or
/dev/shm file survives.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import time
from multiprocessing import connection
from pathlib import Path
from typing import Any

import psutil
import pytest

from conveyor import (
    DataLoader,
    IterableDataset,
    WorkerCrashedError,
    WorkerError,
    WorkerRestartedWarning,
    WorkerTimeoutError,
)
from conveyor._workers.pool import WorkerPool
from tests.faults import CHEAP_METHODS, matrix
from tests.helpers import leaks
from tests.helpers.sync import Mailbox, post, wait_exit, wait_posted

pytestmark = pytest.mark.timeout(90)


class DiesAt:
    """Sample ``i`` is the worker's pid; ``dataset[bad]`` kills the worker ``how``.

    ``how="sleep"`` hangs for 30 s instead. With a ``mailbox`` path, ``dataset[bad]``
    first posts the worker's pid there.
    """

    def __init__(self, how: str, bad: int, length: int = 8, mailbox: str = "") -> None:
        self.how = how
        self.bad = bad
        self.length = length
        self.mailbox = mailbox

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            if self.mailbox:
                post(self.mailbox, str(os.getpid()))
            if self.how == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "SIGSEGV":
                faulthandler.disable()  # pytest's, inherited by fork: keep the output clean
                ctypes.string_at(0)
            elif self.how == "exit3":
                os._exit(3)
            elif self.how == "sleep":
                time.sleep(30)
        return os.getpid()


class IterDiesAt(IterableDataset):
    """Yields the worker's pid; the third item kills the worker with SIGKILL."""

    def __iter__(self) -> Any:
        for i in range(6):
            if i == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            yield os.getpid()


def _loader(dataset: Any, start_method: str, **kwargs: Any) -> DataLoader:
    return DataLoader(
        dataset, batch_size=2, num_workers=1, multiprocessing_context=start_method, **kwargs
    )


@pytest.mark.parametrize(
    ("start_method", "how", "exitcode", "words"),
    matrix(
        [
            ("SIGKILL", -9, "killed by signal SIGKILL (-9)"),
            ("SIGSEGV", -11, "killed by signal SIGSEGV (-11)"),
            ("exit3", 3, "exit code 3"),
        ]
    ),
)
def test_dead_worker_without_restarts_raises_crash_error_naming_it(
    start_method: str, how: str, exitcode: int, words: str
) -> None:
    # prefetch_factor=1 without run-ahead: the worker holds exactly one batch when it
    # dies, [2, 3].
    loader = _loader(
        DiesAt(how, bad=3),
        start_method,
        prefetch_factor=1,
        run_ahead=False,
        max_worker_restarts=0,
    )
    it = iter(loader)
    pid = next(it)[0].item()

    with pytest.raises(WorkerCrashedError) as info:
        next(it)

    exc = info.value
    assert isinstance(exc, WorkerError)
    assert isinstance(exc, RuntimeError)
    assert (exc.worker_id, exc.pid, exc.exitcode, exc.indices) == (0, pid, exitcode, (2, 3))
    message = str(exc)
    assert f"DataLoader worker 0 (pid {pid}) exited unexpectedly" in message
    assert "dataset indices [2, 3]" in message
    assert words in message
    assert "max_worker_restarts=0" in message


@pytest.mark.parametrize(("how", "deaths"), [("SIGSEGV", 3), ("SIGKILL", 4)])
def test_sample_that_kills_its_worker_every_time_is_named(
    start_method: str, how: str, deaths: int
) -> None:
    # The batch dies, its traced retry names sample 3, and sample 3 alone kills a fresh
    # worker too: proof for a crash of its own (SIGSEGV). SIGKILL may come from outside
    # (the OOM killer), so it must kill a fresh worker alone twice.
    loader = _loader(DiesAt(how, bad=3), start_method, prefetch_factor=1, run_ahead=False)
    it = iter(loader)
    first_pid = next(it)[0].item()

    with (
        pytest.warns(WorkerRestartedWarning, match="Started a replacement") as record,
        pytest.raises(WorkerCrashedError) as info,
    ):
        next(it)

    assert [w.category for w in record] == [WorkerRestartedWarning] * (deaths - 1)
    assert f"worker 0 (pid {first_pid}) exited unexpectedly" in str(record[0].message)
    exc = info.value
    assert exc.pid != first_pid  # the replacement died too
    code = -getattr(signal, how)
    assert (exc.worker_id, exc.exitcode, exc.indices) == (0, code, (2, 3))
    message = str(exc)
    assert f"DataLoader worker 0 (pid {exc.pid}) exited unexpectedly" in message
    assert f"killed by signal {how} ({code})" in message
    assert f"at dataset index 3 (tried alone in a fresh worker): killed by signal {how}" in message
    last = "the last time" if how == "SIGSEGV" else "the last 2 times"
    assert f"Dataset index 3 killed its worker {deaths} times, {last} alone" in message
    assert "after trying dataset index 3 alone in it first" in str(record[1].message)


def test_dead_iterable_dataset_worker_is_not_restarted(start_method: str) -> None:
    loader = _loader(IterDiesAt(), start_method)
    it = iter(loader)
    pid = next(it)[0].item()

    with pytest.raises(WorkerCrashedError) as info:
        next(it)

    exc = info.value
    assert (exc.worker_id, exc.pid, exc.exitcode, exc.indices) == (0, pid, -9, ())
    assert "killed by signal SIGKILL (-9)" in str(exc)
    assert "iterator cannot be resumed" in str(exc)


def test_a_crash_heard_of_with_the_start_is_raised_after_the_batches_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a busy machine the loop may first hear from a worker once it is dead: its
    # Ready, its first batch and its death in one wait, still inside iter(). The
    # first batch must come first; the crash, at its place.
    real_wait = WorkerPool.wait

    def wait_until_they_died(pool: WorkerPool, timeout: float | None) -> list[Any]:
        connection.wait([w.process.sentinel for w in pool._workers])
        monkeypatch.setattr(WorkerPool, "wait", real_wait)
        return real_wait(pool, timeout)

    monkeypatch.setattr(WorkerPool, "wait", wait_until_they_died)
    it = iter(_loader(IterDiesAt(), "fork"))
    pid = next(it)[0].item()
    with pytest.raises(WorkerCrashedError) as info:
        next(it)
    assert (info.value.pid, info.value.exitcode) == (pid, -9)


class WorkerZeroStartsLate:
    """worker_init_fn: worker 0 starts only once something is posted to ``gate``."""

    def __init__(self, gate: str) -> None:
        self.gate = gate

    def __call__(self, worker_id: int) -> None:
        if worker_id == 0:
            wait_posted(self.gate)


class KillsAtOne:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return index


def test_a_crash_heard_of_before_another_workers_start_comes_at_its_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Worker 1 starts, takes batch 1 and dies before worker 0 has even started: not a
    # failure to start, so iter() returns and batch 0 comes before the crash.
    real_wait = WorkerPool.wait
    with Mailbox(tmp_path / "gate") as gate:

        def wait_until_worker_1_died(pool: WorkerPool, timeout: float | None) -> list[Any]:
            connection.wait([pool._workers[1].process.sentinel])
            monkeypatch.setattr(WorkerPool, "wait", real_wait)
            events = real_wait(pool, timeout)
            post(gate.path, "start")  # worker 0 now
            return events

        monkeypatch.setattr(WorkerPool, "wait", wait_until_worker_1_died)
        loader = DataLoader(
            KillsAtOne(), num_workers=2, multiprocessing_context="fork", max_worker_restarts=0,
            worker_init_fn=WorkerZeroStartsLate(gate.path), run_ahead=False,
        )  # fmt: skip
        it = iter(loader)
        assert next(it).item() == 0
        with pytest.raises(WorkerCrashedError) as info:
            next(it)
    assert info.value.worker_id == 1 and 1 in info.value.indices


@pytest.mark.parametrize("start_method", CHEAP_METHODS)
def test_batch_finished_before_a_fatal_crash_is_still_delivered(
    start_method: str, tmp_path: Path
) -> None:
    # Batch 1 = [2, 3] kills the worker; batch 0 is done by then.
    with Mailbox(tmp_path / "reached") as box:
        dataset = DiesAt("SIGKILL", bad=2, mailbox=box.path)
        it = iter(_loader(dataset, start_method, max_worker_restarts=0))
        pid = int(box.wait())  # the worker is in dataset[2]...
        wait_exit(pid)  # ...and dead: batch 0 is in the pipe by now

    batch = next(it)
    assert batch.tolist() == [pid, pid]  # made by the worker that died next
    with pytest.raises(WorkerCrashedError) as info:
        next(it)
    # It died on batch 1; the tasks it held start there (a task sent after its
    # death, before the main process saw it, may follow).
    assert info.value.indices[:2] == (2, 3)
    assert "during fetch of batch 1 (dataset indices [2, 3])" in str(info.value)


def test_stuck_worker_times_out_naming_worker_indices_and_stack(
    start_method: str, tmp_path: Path
) -> None:
    # The timeout counts a worker's start-up too, as torch's does: one started by spawn
    # or forkserver imports its modules afresh, seconds on a busy machine.
    timeout = 1 if start_method == "fork" else 10
    with Mailbox(tmp_path / "reached") as box:
        loader = _loader(DiesAt("sleep", bad=1, mailbox=box.path), start_method, timeout=timeout)
        it = iter(loader)
        worker = psutil.Process(int(box.wait()))  # it is in dataset[1] now, for 30 s
    started = time.monotonic()

    with pytest.raises(WorkerTimeoutError) as info:
        next(it)

    # The timeout, then the stuck worker is stopped (terminated): nowhere near 30 s.
    assert time.monotonic() - started < timeout + 9
    assert not leaks.is_alive(worker)
    exc = info.value
    assert isinstance(exc, TimeoutError)
    assert isinstance(exc, RuntimeError)
    message = str(exc)
    assert f"timed out after {timeout} seconds" in message
    assert f"worker 0 (pid {worker.pid})" in message
    assert "dataset indices [0, 1]" in message
    assert "The worker's current Python stack" in message
    assert "in __getitem__" in message  # where it sleeps


def test_timeout_error_has_worker_and_indices_attributes(tmp_path: Path) -> None:
    with Mailbox(tmp_path / "reached") as box:
        loader = _loader(DiesAt("sleep", bad=1, mailbox=box.path), "fork", timeout=1)

        with pytest.raises(WorkerTimeoutError) as info:
            next(iter(loader))

        pid = int(box.wait())  # posted before it hung

    exc: Any = info.value
    assert (exc.worker_id, exc.pid, exc.indices) == (0, pid, (0, 1))
