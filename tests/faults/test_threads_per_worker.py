"""Worker processes that run several cores in threads (``threads_per_worker``) meet
real faults: a segfault in one core's thread, a poison sample, a stuck thread killed
with its process, a kill from outside. The process dies with every core in it; the
core whose doing it was is told apart (faulthandler's crash dump names its thread,
or the loop killed the process for it), the others are restarted with it and their
tasks re-sent with no evidence against them, and one restart is charged a death.
Nothing is lost or repeated; the autouse ``leak_check`` fixture (conftest.py) checks
that no process, memfd or /dev/shm file survives.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from conveyor import DataLoader, LoaderStatistics, WorkerRestartedWarning, WorkerTimeoutError
from conveyor._workers import pool as pool_module

pytestmark = pytest.mark.timeout(90)

N, BAD = 18, 7


def _timeout(start_method: str) -> float:
    """A timeout a stuck sample reaches soon, but a starting worker does not: one started
    by spawn or forkserver imports its modules afresh (seconds, on a busy machine), and
    its start-up counts against ``timeout`` too."""
    return 1 if start_method == "fork" else 10


class FailsAt:
    """Sample ``i`` is ``i``; ``dataset[BAD]`` fails ``how``: the first time only when
    ``once_marker`` is a path (the file says it happened), else every time."""

    def __init__(self, how: str, once_marker: str = "") -> None:
        self.how = how
        self.once_marker = once_marker

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        if i == BAD and self._now():
            if self.how == "SIGSEGV":
                ctypes.string_at(0)  # a real segfault, in this core's thread
            elif self.how == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
            elif self.how == "hang":
                time.sleep(60)
        return i

    def _now(self) -> bool:
        if not self.once_marker:
            return True
        try:
            os.close(os.open(self.once_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def _run(dataset: Any, start_method: str, **kwargs: Any) -> tuple[list[int], list[str]]:
    """Every sample the loader hands out, in order, and the restart warnings' texts."""
    options: dict[str, Any] = dict(
        batch_size=1, num_workers=1, threads_per_worker=3, multiprocessing_context=start_method
    )
    options.update(kwargs)
    loader = DataLoader(dataset, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", WorkerRestartedWarning)
        samples = [i for batch in loader for i in batch.tolist()]
    said = [str(w.message) for w in caught if issubclass(w.category, WorkerRestartedWarning)]
    return samples, said


def test_a_segfault_in_one_cores_thread_restarts_the_process_and_blames_that_core(
    start_method: str, tmp_path: Path
) -> None:
    dataset = FailsAt("SIGSEGV", once_marker=str(tmp_path / "crashed"))
    samples, said = _run(dataset, start_method, max_worker_restarts=1)
    assert samples == list(range(N))  # every sample once, in order
    assert len(said) == 1, said  # one death, one warning: the crashed core's
    (report,) = said
    assert f"during fetch of batch {BAD} (dataset indices [{BAD}])" in report
    assert "killed by signal SIGSEGV" in report
    assert "restart 1 of 1" in report  # one process died: one restart charged
    assert "ran as threads of the same process and were restarted with it" in report


def test_a_sample_that_segfaults_every_time_is_proven_and_left_out_under_skip(
    start_method: str,
) -> None:
    loader_kwargs = dict(on_error="skip", max_errors=1, max_worker_restarts=1)
    dataset = FailsAt("SIGSEGV")
    loader = DataLoader(
        dataset, batch_size=1, num_workers=1, threads_per_worker=3,
        multiprocessing_context=start_method, **loader_kwargs,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        samples = [i for batch in loader for i in batch.tolist()]
    assert samples == [i for i in range(N) if i != BAD]
    (skipped,) = loader.skipped_samples
    assert (skipped.index, skipped.stage) == (BAD, "crash")


def test_a_stuck_thread_is_killed_with_its_process_and_its_siblings_work_resent(
    start_method: str, tmp_path: Path
) -> None:
    dataset = FailsAt("hang", once_marker=str(tmp_path / "hung"))
    samples, said = _run(
        dataset, start_method, timeout=_timeout(start_method), on_timeout="restart"
    )
    assert samples == list(range(N))
    assert len(said) == 1, said
    assert f"batch {BAD}" in said[0] and "ran as threads of the same process" in said[0]


def test_a_stuck_threads_timeout_shows_that_threads_stack_alone(start_method: str) -> None:
    loader = DataLoader(
        FailsAt("hang"), batch_size=1, num_workers=1, threads_per_worker=3,
        timeout=_timeout(start_method),
        multiprocessing_context=start_method,
    )  # fmt: skip
    with pytest.raises(WorkerTimeoutError) as caught:
        list(loader)
    text = str(caught.value)
    assert f"dataset indices [{BAD}]" in text
    assert "in __getitem__" in text  # where it is stuck, from its thread's own stack
    headers = [line for line in text.splitlines() if "thread 0x" in line.lower()]
    assert len(headers) == 1, text  # its own thread's stack, not its siblings'


def test_a_kill_from_outside_ends_every_core_and_is_charged_once(
    start_method: str, tmp_path: Path
) -> None:
    dataset = FailsAt("SIGKILL", once_marker=str(tmp_path / "killed"))
    samples, said = _run(dataset, start_method, max_worker_restarts=1)
    assert samples == list(range(N))
    assert said and all("SIGKILL" in text for text in said)


class KilledTwice:
    """Samples 9 and 15 (sent once iter() has returned) each kill a process once (a real
    SIGKILL, as the OOM killer sends), in two processes one after the other: 9 kills the
    first, 15 its replacement. (Both can be in flight in the first process's cores at
    once: had 15 killed there too, one death would have taken both, and the test counted
    1 death where it asserts 2, about 1 run in 6.) The markers in ``marker_dir`` say who
    killed: 9's holds the first process's pid."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir

    def __len__(self) -> int:
        return N

    def _kill_once(self, i: int) -> None:
        try:
            fd = os.open(f"{self.marker_dir}/{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)

    def _first_process(self) -> bool:
        try:
            with open(f"{self.marker_dir}/9") as marker:
                # Empty: 9 is writing it, in this process (in a later one it exists whole).
                return marker.read() in ("", str(os.getpid()))
        except FileNotFoundError:  # 9 is in flight here too, and is about to kill us
            return True

    def __getitem__(self, i: int) -> int:
        if i == 9:
            self._kill_once(9)
        elif i == 15:
            if self._first_process():
                threading.Event().wait()  # until 9's SIGKILL ends this process
            self._kill_once(15)
        return i


def test_statistics_from_another_thread_while_a_killed_process_is_replaced(
    start_method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``statistics()`` asked from another thread just as a killed process of 4 cores is
    replaced answers (it raised "process object is closed"); ``worker_restarts`` counts
    process deaths, as ``max_worker_restarts`` charges them (it said 8 for 2)."""
    replacing, answered = threading.Event(), threading.Event()
    answers: list[object] = []
    start_worker = pool_module.start_worker
    starts: list[int] = []

    def start_worker_slowly(*args: Any, **kwargs: Any) -> Any:
        starts.append(1)
        if len(starts) == 2:  # the first replacement: its old cores are let go already
            replacing.set()
            answered.wait(30)
        return start_worker(*args, **kwargs)

    def ask() -> None:
        replacing.wait(30)
        try:
            answers.append(loader.statistics())
        except Exception as error:
            answers.append(error)
        answered.set()

    monkeypatch.setattr(pool_module, "start_worker", start_worker_slowly)
    loader = DataLoader(
        KilledTwice(str(tmp_path)), batch_size=1, num_workers=1, threads_per_worker=4,
        max_worker_restarts=2, multiprocessing_context=start_method, preflight=False,
        run_ahead=False,  # index 9 is sent only once a batch is handed out
    )  # fmt: skip
    asker = threading.Thread(target=ask)  # (blocked on an Event: safe to fork beside)
    asker.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        samples = [i for batch in loader for i in batch.tolist()]
    asker.join()
    assert samples == list(range(N))
    assert len(answers) == 1 and isinstance(answers[0], LoaderStatistics), answers
    stats = loader.statistics()
    assert stats is not None and stats.worker_restarts == 2
    assert [w.restarts for w in stats.workers] == [2, 2, 2, 2]  # each core, with its process
