"""Workers that die or hang: a named error, and nothing left behind.

A dead worker is replaced and its tasks re-sent (``max_worker_restarts``, 3 by
default); a sample that kills its worker twice, a spent restart budget, or an
iterable-style dataset (whose iterator cannot be resumed) end in
``WorkerCrashedError``. Every case runs under fork, spawn and forkserver; the
autouse ``leak_check`` fixture (conftest.py) checks that no process, memfd or
/dev/shm file survives.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor import (
    DataLoader,
    IterableDataset,
    WorkerCrashedError,
    WorkerError,
    WorkerTimeoutError,
)
from tests.helpers import leaks

pytestmark = pytest.mark.timeout(90)


class DiesAt:
    """Sample ``i`` is the worker's pid; ``dataset[bad]`` kills the worker ``how``.

    ``how="sleep"`` hangs for 30 s instead, after creating the file ``marker``.
    """

    def __init__(self, how: str, bad: int, length: int = 8, marker: str = "") -> None:
        self.how = how
        self.bad = bad
        self.length = length
        self.marker = marker

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            if self.how == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "SIGSEGV":
                faulthandler.disable()  # pytest's, inherited by fork: keep the output clean
                ctypes.string_at(0)
            elif self.how == "exit3":
                os._exit(3)
            elif self.how == "sleep":
                if self.marker:
                    open(self.marker, "w").close()
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


def _wait_until_dead(procs: list[Any], timeout: float = 30.0) -> None:
    assert procs, "no worker process started"
    still = leaks.wait_gone(procs, timeout)
    assert not still, "worker did not die:\n" + leaks.describe(still)


CRASHES = pytest.mark.parametrize(
    ("how", "exitcode", "words"),
    [
        ("SIGKILL", -9, "killed by signal SIGKILL (-9)"),
        ("SIGSEGV", -11, "killed by signal SIGSEGV (-11)"),
        ("exit3", 3, "exit code 3"),
    ],
)


@CRASHES
def test_dead_worker_without_restarts_raises_crash_error_naming_it(
    start_method: str, how: str, exitcode: int, words: str
) -> None:
    # prefetch_factor=1: the worker holds exactly one batch when it dies, [2, 3].
    loader = _loader(DiesAt(how, bad=3), start_method, prefetch_factor=1, max_worker_restarts=0)
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


def test_sample_that_kills_its_worker_twice_is_named(start_method: str) -> None:
    loader = _loader(DiesAt("SIGKILL", bad=3), start_method, prefetch_factor=1)
    it = iter(loader)
    first_pid = next(it)[0].item()

    with (
        pytest.warns(RuntimeWarning, match="Started a replacement") as record,
        pytest.raises(WorkerCrashedError) as info,
    ):
        next(it)

    assert [type(w.message).__name__ for w in record] == ["WorkerRestartedWarning"]
    assert f"worker 0 (pid {first_pid}) exited unexpectedly" in str(record[0].message)
    exc = info.value
    assert exc.pid != first_pid  # the replacement died too
    assert (exc.worker_id, exc.exitcode, exc.indices) == (0, -9, (2, 3))
    message = str(exc)
    assert f"DataLoader worker 0 (pid {exc.pid}) exited unexpectedly" in message
    assert "killed by signal SIGKILL (-9)" in message
    assert "Dataset index 3 killed its worker twice" in message


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


@pytest.mark.xfail(
    strict=True,
    reason="BUG: when conveyor gives up on a dead worker (here max_worker_restarts=0), "
    "MultiprocessIterator._receive -> _recover raises WorkerCrashedError at once, before "
    "an earlier batch that worker finished (already received, in _results) is handed out",
)
def test_batch_finished_before_a_fatal_crash_is_still_delivered(start_method: str) -> None:
    before = leaks.LeakSnapshot.take()
    # Batch 1 = [2, 3] kills the worker; batch 0 is done by then.
    it = iter(_loader(DiesAt("SIGKILL", bad=2), start_method, max_worker_restarts=0))
    _wait_until_dead(leaks.new_processes(before))  # batch 0 is in the pipe by now

    batch = next(it)
    assert batch.tolist()[0] > 0
    with pytest.raises(WorkerCrashedError) as info:
        next(it)
    assert info.value.indices == (2, 3)


def _wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_stuck_worker_times_out_naming_worker_indices_and_stack(
    start_method: str, tmp_path: Path
) -> None:
    before = leaks.LeakSnapshot.take()
    marker = tmp_path / "sleeping"
    loader = _loader(DiesAt("sleep", bad=1, marker=str(marker)), start_method, timeout=1)
    it = iter(loader)
    (worker,) = leaks.new_processes(before)
    _wait_for_file(marker)  # the worker is in dataset[1] (a spawn worker takes a while)
    started = time.monotonic()

    with pytest.raises(WorkerTimeoutError) as info:
        next(it)

    # 1 s timeout, then the stuck worker is stopped (terminated): nowhere near 30 s.
    assert time.monotonic() - started < 15
    assert not leaks.is_alive(worker)
    exc = info.value
    assert isinstance(exc, TimeoutError)
    assert isinstance(exc, RuntimeError)
    message = str(exc)
    assert "timed out after 1 seconds" in message
    assert f"worker 0 (pid {worker.pid})" in message
    assert "dataset indices [0, 1]" in message
    assert "The worker's current Python stack" in message
    assert "in __getitem__" in message  # where it sleeps


def init_sleeps(worker_id: int) -> None:
    time.sleep(30)


@pytest.mark.xfail(
    strict=True,
    reason="BUG: a timeout while the worker is still starting (here in worker_init_fn) is "
    "reported as batch 0's sample being stuck ('find what blocks that sample'); the "
    "worker's status page knows it is in worker_init",
)
def test_timeout_during_worker_init_says_so() -> None:
    loader = _loader(DiesAt("none", bad=-1), "fork", timeout=1, worker_init_fn=init_sleeps)

    with pytest.raises(WorkerTimeoutError) as info:
        next(iter(loader))

    summary = str(info.value).split("\n")[0]  # the stack below names the test itself
    assert "worker_init" in summary
    assert "find what blocks that sample" not in summary


@pytest.mark.xfail(
    strict=True,
    reason="BUG: WorkerTimeoutError carries worker id, pid and indices only in its message; "
    "unlike WorkerCrashedError it has no worker_id/pid/indices attributes",
)
def test_timeout_error_has_worker_and_indices_attributes() -> None:
    loader = _loader(DiesAt("sleep", bad=1), "fork", timeout=1)

    with pytest.raises(WorkerTimeoutError) as info:
        next(iter(loader))

    exc: Any = info.value
    assert (exc.worker_id, exc.indices) == (0, (0, 1))
    assert exc.pid > 0
