"""Kills from outside must not make conveyor accuse a sample, or give up the run.

The OOM killer under pressure from another process, an operator, a scheduler: they
SIGKILL whichever worker they pick, and when they strike at a steady pace while the
samples take a steady time, the kills land at the same sample of the same batch
again and again. A sample is called poison only when it also kills a fresh worker
while fetched alone (tests/unit/test_book.py tables the rule); here the kills are
real, under every start method (spawn and forkserver with ``-m slow``), and each is
ordered by an event: the worker's first fetch, posted by the dataset to a mailbox.
The autouse ``leak_check`` fixture (conftest.py) checks for leftovers after each.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conveyor import DataLoader, WorkerRestartedWarning, get_worker_info
from tests.helpers.sync import Mailbox, post, wait_exit, wait_posted

pytestmark = pytest.mark.timeout(180)

LENGTH = 24
BATCH = 4
SAMPLE_S = 0.15  # a decode, say: a batch takes 0.6 s
KILL_AFTER_S = 0.4  # after a worker's first fetch: inside its first batch, every time
ROUNDS = 5


class Reports:
    """``dataset[i] == i`` after ``SAMPLE_S``; the first fetch in each worker process
    posts ``"<worker id> <pid>"`` to the mailbox at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reported = 0

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> int:
        pid = os.getpid()
        if self._reported != pid:
            self._reported = pid
            info = get_worker_info()
            assert info is not None
            post(self.path, f"{info.id} {pid}")
        time.sleep(SAMPLE_S)
        return index


@contextmanager
def kill_every_worker(box: Mailbox, workers: int) -> Iterator[threading.Event]:
    """A thread that kills each worker ``ROUNDS`` times: ``KILL_AFTER_S`` after each
    new worker process's first fetch, then waits until it is dead. The event is set
    when it is done (or failed: its error is raised when the block ends)."""
    done = threading.Event()
    errors: list[BaseException] = []
    kills = dict.fromkeys(range(workers), 0)

    def run() -> None:
        due: dict[int, tuple[int, float]] = {}  # worker -> (pid, when to kill it)
        while any(n < ROUNDS for n in kills.values()):
            now = time.monotonic()
            for worker, (pid, when) in list(due.items()):
                if when <= now:
                    os.kill(pid, signal.SIGKILL)
                    wait_exit(pid)
                    kills[worker] += 1
                    del due[worker]
            if due:
                try:
                    line = box.wait(timeout=max(0.0, min(w for _, w in due.values()) - now))
                except TimeoutError:
                    continue  # a kill is due
            elif any(n < ROUNDS for n in kills.values()):
                line = box.wait()
            else:
                break
            worker, pid = map(int, line.split())
            if kills[worker] < ROUNDS:
                due[worker] = (pid, time.monotonic() + KILL_AFTER_S)

    def guarded() -> None:
        try:
            run()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        thread.join()
    if errors:
        raise errors[0]
    assert kills == dict.fromkeys(range(workers), ROUNDS)


@pytest.mark.slow  # SIGKILLs workers round after round (about 6 s)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_kills_from_outside_at_the_same_sample_accuse_nothing(
    start_method: str, on_error: str, tmp_path: Path
) -> None:
    workers = 2
    with Mailbox(tmp_path / "first-fetch") as box:
        loader = DataLoader(
            Reports(box.path), batch_size=BATCH, num_workers=workers, persistent_workers=True,
            multiprocessing_context=start_method, max_worker_restarts=100, on_error=on_error,
            preflight=False,  # the killer is a thread of this process, on purpose
        )  # fmt: skip
        epochs = 0
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always", WorkerRestartedWarning)
            with kill_every_worker(box, workers) as done:
                while not done.is_set():
                    got = [int(i) for batch in loader for i in batch]
                    assert got == list(range(LENGTH)), f"epoch {epochs}"
                    epochs += 1
            # Every worker has tasks in an epoch: this one sees the last deaths.
            assert [int(i) for batch in loader for i in batch] == list(range(LENGTH))
        stats = loader.statistics()
        skipped = loader.skipped_samples
        del loader

    assert stats is not None
    assert stats.worker_restarts == workers * ROUNDS  # each kill seen once, replaced
    assert [type(w.message) for w in record] == [WorkerRestartedWarning] * (workers * ROUNDS)
    assert not any("killed its worker" in str(w.message) for w in record)
    assert (skipped, stats.samples_skipped) == ((), 0)


class BlocksWhileStarting:
    """worker_init_fn: posts the worker's pid to ``started``, then waits until the test
    posts to ``gate`` (a worker blocked there can be killed while starting)."""

    def __init__(self, started: str, gate: str) -> None:
        self.started = started
        self.gate = gate

    def __call__(self, worker_id: int) -> None:
        post(self.started, str(os.getpid()))
        wait_posted(self.gate)


# The killer thread runs while workers are forked: Python 3.12+ warns of that, rightly.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_worker_killed_twice_while_starting_is_replaced_within_the_budget(
    start_method: str, tmp_path: Path
) -> None:
    # Killed from outside twice in a row during start-up (in worker_init_fn): that says
    # nothing about start-up itself; max_worker_restarts=2 allows both replacements.
    with Mailbox(tmp_path / "started") as started, Mailbox(tmp_path / "gate") as gate:
        loader = DataLoader(
            list(range(8)), batch_size=2, num_workers=1, multiprocessing_context=start_method,
            worker_init_fn=BlocksWhileStarting(started.path, gate.path), max_worker_restarts=2,
            preflight=False,  # the killer is a thread of this process, on purpose
        )  # fmt: skip
        pids: list[int] = []

        def kill_twice_then_let_start() -> None:
            for _ in range(2):
                pids.append(int(started.wait()))
                os.kill(pids[-1], signal.SIGKILL)
                wait_exit(pids[-1])
            pids.append(int(started.wait()))
            post(gate.path, "go")

        killer = threading.Thread(target=kill_twice_then_let_start, daemon=True)
        killer.start()
        with pytest.warns(WorkerRestartedWarning) as warned:
            got = [b.tolist() for b in loader]
        killer.join()
        record = [w for w in warned if w.category is WorkerRestartedWarning]

    assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert len(set(pids)) == 3  # two killed while starting, the third served
    assert len(record) == 2
    for warning, pid in zip(record, pids, strict=False):
        text = str(warning.message)
        assert f"worker 0 (pid {pid}) exited unexpectedly during worker_init" in text
        assert "killed by signal SIGKILL (-9)" in text
    assert "(restart 2 of 2)" in str(record[1].message)
    stats = loader.statistics()
    assert stats is not None
    assert (stats.worker_restarts, stats.workers[0].pid) == (2, pids[2])
