"""However iteration ends, the workers and their shared memory go with it.

Break, drop, raise, persistent workers, Ctrl-C, a killed main process, and a
user who keeps every batch: within 5 s no worker process and no conveyor memfd
remains. Teardown is checked without ``gc.collect()`` where torch needs none.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from conveyor import BatchesHeldWarning, DataLoader, WorkerCrashedError, WorkerRestartedWarning
from tests.faults import CHEAP_METHODS
from tests.helpers import leaks
from tests.helpers.interrupts import CHILD_ENV, CtrlCAsItDies

pytestmark = pytest.mark.timeout(120)

SCRIPTS = Path(__file__).parent / "scripts"
STARTUP_TIMEOUT_S = 60.0  # a child program importing torch on busy cores


class Pids:
    """Sample ``i`` is the pid of the worker that fetched it."""

    def __init__(self, length: int = 64) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return os.getpid()


class Arrays:
    """Sample ``i`` is an array full of ``i``: each batch has its own contents."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(256, index, dtype=np.int64)


def _loader(start_method: str, **kwargs: Any) -> DataLoader:
    return DataLoader(
        Pids(), batch_size=1, num_workers=2, multiprocessing_context=start_method, **kwargs
    )


def _track(workers: list[psutil.Process], pid: int) -> None:
    """Note the worker that made a batch (while it runs: psutil needs it alive).

    A worker may already be gone: with forkserver its parent (the fork server)
    reaps it at once, so one that dies right after its batch (DiesAt5, on a
    loaded machine) cannot be looked up any more. That one is gone, as wanted.
    """
    if pid in [w.pid for w in workers]:
        return
    try:
        workers.append(psutil.Process(pid))
    except psutil.NoSuchProcess:
        workers.append(_Gone(pid))  # type: ignore[arg-type]


class _Gone:
    """A worker that exited and was reaped before it could be looked up: it
    answers the leak helpers (is_alive, describe) the way a vanished process does."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def is_running(self) -> bool:
        return False

    def status(self) -> str:
        raise psutil.NoSuchProcess(self.pid)

    def cmdline(self) -> list[str]:
        raise psutil.NoSuchProcess(self.pid)


def _take_worker_pids(it: Iterator[Any]) -> list[psutil.Process]:
    """Read batches until both workers have delivered one; their processes."""
    workers: list[psutil.Process] = []
    while len(workers) < 2:
        _track(workers, next(it).item())
    return workers


def _assert_torn_down(before: leaks.LeakSnapshot, workers: list[psutil.Process]) -> None:
    survivors = leaks.wait_gone(workers, 5.0)
    assert not survivors, "workers still running after 5 s:\n" + leaks.describe(survivors)
    fds = set(leaks.memfd_fds().items()) - before.fds
    assert not fds, f"conveyor memfds still open: {sorted(fds)}"


# --- the loop ends early ----------------------------------------------------------


def test_break_out_of_the_loop(start_method: str, leak_check: leaks.LeakSnapshot) -> None:
    loader = _loader(start_method)
    workers: list[psutil.Process] = []
    for batch in loader:
        _track(workers, batch.item())
        if len(workers) == 2:
            break
    del batch

    _assert_torn_down(leak_check, workers)


def test_drop_the_iterator(start_method: str, leak_check: leaks.LeakSnapshot) -> None:
    loader = _loader(start_method)
    it = iter(loader)
    workers = _take_worker_pids(it)
    del it  # the loader lives on

    _assert_torn_down(leak_check, workers)


def test_raise_inside_the_loop_body(start_method: str, leak_check: leaks.LeakSnapshot) -> None:
    loader = _loader(start_method)
    workers: list[psutil.Process] = []
    with pytest.raises(ZeroDivisionError):
        for batch in loader:
            _track(workers, batch.item())
            if len(workers) == 2:
                print(1 / 0)
    del batch

    _assert_torn_down(leak_check, workers)


# --- persistent workers ---------------------------------------------------------


def test_persistent_workers_stop_when_the_loader_is_collected(
    start_method: str, leak_check: leaks.LeakSnapshot
) -> None:
    loader = _loader(start_method, persistent_workers=True)
    first = {b.item() for b in loader}
    it = iter(loader)
    workers = _take_worker_pids(it)
    assert {w.pid for w in workers} == first  # the same workers, epoch after epoch
    del it, loader
    gc.collect()

    _assert_torn_down(leak_check, workers)


def test_persistent_workers_stop_at_del_loader_like_torch() -> None:
    loader = _loader("fork", persistent_workers=True)
    workers = _take_worker_pids(iter(loader))
    gc.disable()  # what "at once" means: by reference counting, as in torch
    try:
        del loader
        survivors = leaks.wait_gone(workers, 3.0)
    finally:
        gc.enable()
    assert not survivors, "workers still running 3 s after del:\n" + leaks.describe(survivors)


class DiesAt5(Pids):
    def __getitem__(self, index: int) -> int:
        if index == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()


@pytest.mark.parametrize("start_method", CHEAP_METHODS)
@pytest.mark.parametrize("end", ["exhausted", "worker_crash"])
def test_finished_iterator_kept_alive_holds_no_shared_memory(
    start_method: str, end: str, leak_check: leaks.LeakSnapshot
) -> None:
    """An iterator that ended (exhausted, or a fatal crash) but is still referenced.

    A user exception does not end an iteration (torch goes on with the next
    batch, so do we): its workers rightly stay until the iterator goes.
    """
    dataset = DiesAt5(8) if end == "worker_crash" else Pids(8)
    it = iter(
        DataLoader(
            dataset, num_workers=2, multiprocessing_context=start_method, max_worker_restarts=0
        )
    )
    workers = _take_worker_pids(it)
    crashed = False
    try:
        collections.deque(it, maxlen=0)  # to the end, keeping no batch
    except WorkerCrashedError:  # a notebook keeps the traceback: keep `it`
        crashed = True
    assert crashed == (end == "worker_crash")
    gc.collect()

    _assert_torn_down(leak_check, workers)  # the workers are gone...
    assert leaks.memfd_maps() - leak_check.maps == frozenset()  # ...and so is their memory


# --- batches kept alive -----------------------------------------------------------


def test_keeping_every_batch_falls_back_to_the_pipe_then_frees_all(
    start_method: str, leak_check: leaks.LeakSnapshot
) -> None:
    # Without the run-ahead budget (which keeps up to 16 MiB of small batches in shared
    # memory), the slots run out after prefetch_factor + 4 kept batches per worker.
    loader = DataLoader(
        Arrays(), batch_size=1, num_workers=2, multiprocessing_context=start_method, run_ahead=False
    )

    with pytest.warns(
        BatchesHeldWarning,
        match="every shared-memory slot is in use.*held by batches still alive in this process",
    ) as record:
        batches = list(loader)

    assert [w.category for w in record] == [BatchesHeldWarning]  # once, not per batch
    assert len(batches) == 200
    for index, batch in enumerate(batches):
        assert batch.shape == (1, 256)
        assert (batch == index).all(), f"batch {index} holds {batch.unique().tolist()}"
    assert leaks.memfd_maps() - leak_check.maps  # slots still mapped: batches alive
    del batches, batch, loader
    gc.collect()

    assert leaks.memfd_maps() - leak_check.maps == frozenset()
    assert set(leaks.memfd_fds().items()) - leak_check.fds == set()


# --- the main process is interrupted or killed -------------------------------------


@contextlib.contextmanager
def _child_in_its_own_group(start_method: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """The slow-loader script as a terminal job: its own process group.

    However the test ends, the whole group is killed, the child reaped and both of its
    pipes closed before the next test starts: an unclosed pipe is a ResourceWarning
    whenever the garbage collector gets to it, and (warnings are errors) that fails
    whatever test is running then.
    """
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "slow_loader.py"), start_method, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()


def _read_worker_pids(child: subprocess.Popen[str]) -> list[psutil.Process]:
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        ready = selector.select(STARTUP_TIMEOUT_S)
    line = child.stdout.readline() if ready else ""
    if not line.startswith("PIDS "):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        _, err = child.communicate(timeout=30)
        pytest.fail(f"the child printed {line!r} instead of its worker pids; stderr:\n{err}")
    return [psutil.Process(int(pid)) for pid in line.split()[1:]]


def test_ctrl_c_gives_one_keyboard_interrupt_and_stops_workers(start_method: str) -> None:
    with _child_in_its_own_group(start_method) as child:
        workers = _read_worker_pids(child)
        os.killpg(child.pid, signal.SIGINT)  # as a terminal does: the whole group
        _, err = child.communicate(timeout=20)
        survivors = leaks.wait_gone(workers, 5.0)  # before the cleanup kills the group

    assert child.returncode == -signal.SIGINT, err
    assert err.count("Traceback") == 1, err
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert not survivors, "workers outlived Ctrl-C:\n" + leaks.describe(survivors)


@pytest.mark.parametrize("started_in", ["main", "thread"])
def test_killed_main_process_takes_its_workers_along(
    start_method: str, started_in: str, leak_check: leaks.LeakSnapshot
) -> None:
    # "thread": workers started by a thread other than the main one die through their
    # parent-watch pipes alone (PR_SET_PDEATHSIG follows the thread that forked).
    args = ("thread",) if started_in == "thread" else ()
    with _child_in_its_own_group(start_method, *args) as child:
        workers = _read_worker_pids(child)
        # Everything the child started: workers, and a fork server or resource tracker.
        descendants = psutil.Process(child.pid).children(recursive=True)
        assert {w.pid for w in workers} <= {p.pid for p in descendants}
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        started = time.monotonic()
        survivors = leaks.wait_gone(descendants, 5.0)
        waited = time.monotonic() - started

    assert not survivors, (
        f"still running {waited:.1f} s after the main process was killed:\n"
        + leaks.describe(survivors)
    )
    assert leaks.new_shm_entries(leak_check) == []


class StartsAChild:
    """Each sample starts a long-running subprocess (a decoder, say) and writes its pid."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        child = subprocess.Popen(["sleep", "300"])
        with open(self.marker, "a") as out:
            out.write(f"{child.pid}\n")
        return index


@pytest.mark.parametrize("how", ["end", "break", "crash"])
def test_processes_a_worker_started_die_with_the_loader(
    start_method: str, how: str, tmp_path: Path
) -> None:
    method = start_method
    marker = tmp_path / "children"
    loader = DataLoader(
        StartsAChild(str(marker)),
        batch_size=2,
        num_workers=1,
        multiprocessing_context=method,
        max_worker_restarts=0,
    )
    it = iter(loader)
    next(it)
    if how == "crash":  # the worker dies first: its child is re-parented, still ours
        worker = psutil.Process(loader.statistics().workers[0].pid)  # type: ignore[union-attr]
        worker.kill()
        with pytest.raises(WorkerCrashedError):
            list(it)
    elif how == "end":
        list(it)
    del it
    gc.collect()
    pids = [int(pid) for pid in marker.read_text().split()]
    assert pids, "the dataset started no subprocess"
    children = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):  # already gone: fine
            children.append(psutil.Process(pid))
    assert leaks.wait_gone(children, 10.0) == [], "a worker's subprocess outlived the loader"


def _setup_memfds() -> list[str]:
    return [name for name in leaks.memfd_fds().values() if "conveyor-setup" in name]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_the_serialized_dataset_is_freed_once_every_worker_loaded_it(method: str) -> None:
    loader = DataLoader(
        Pids(16), batch_size=4, num_workers=2, persistent_workers=True,
        multiprocessing_context=method,
    )  # fmt: skip
    first = {int(pid) for batch in loader for pid in batch}
    assert len(first) == 2 and _setup_memfds() == []  # both loaded it: freed
    psutil.Process(first.pop()).kill()  # a replacement must get it again
    with pytest.warns(WorkerRestartedWarning, match=r"SIGKILL"):
        second = {int(pid) for batch in loader for pid in batch}
    assert len(second) == 2 and _setup_memfds() == []


@pytest.mark.parametrize(
    "start_method",
    [pytest.param(m, marks=pytest.mark.slow) for m in ("fork", "forkserver", "spawn")],
)  # (all slow: a child process interrupted during teardown, about 6 s each)
def test_ctrl_c_during_teardown_leaves_nothing_behind(start_method: str) -> None:
    # ~4 s each (teardown waits out its grace period for busy workers): the default
    # run keeps fork; -m slow adds the others.
    left, stderr = _run_script("interrupted_teardown.py", start_method)
    # The first Ctrl-C came while both workers ran; the second arrived during teardown
    # and was acted on (by the program's own handler) once teardown was complete.
    assert left["sigints"] == [
        {"in_teardown": False, "running": 2},
        {"in_teardown": True, "running": 0},
    ], stderr
    # One KeyboardInterrupt, kept with its traceback; no worker, and no descriptor
    # opened since the loader was made (memfd, pipe or socket), is left.
    assert (left["caught"], left["kept"]) == (1, True), stderr
    assert (left["alive"], left["fds"]) == ([], []), stderr


def test_ctrl_c_as_the_users_batch_dies_is_raised_in_their_code_and_the_epoch_goes_on_whole(
    start_method: str, leak_check: leaks.LeakSnapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch dies wherever the user drops it, and conveyor learns of it there (the slot
    # under it goes back to its worker). A real SIGINT just before that moment was
    # raised inside conveyor's callback, where Python prints it as ignored: the
    # interrupt was lost and the training loop ran on (CI, the sweep below, at 0.65 s).
    ignored: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    it = iter(
        DataLoader(Arrays(), batch_size=8, num_workers=2, multiprocessing_context=start_method)
    )
    first = next(it)
    seen = [int(row[0]) for row in first]
    ctrl_c = CtrlCAsItDies(first)
    del first
    assert isinstance(ctrl_c.drop(), KeyboardInterrupt)  # the batch dies, a SIGINT just before
    assert ignored == []
    seen += [int(row[0]) for batch in it for row in batch]  # its slot went back
    assert seen == list(range(len(Arrays())))


def test_workers_whose_closing_a_ctrl_c_cut_short_are_stopped_by_the_next_iter(
    start_method: str, leak_check: leaks.LeakSnapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An iterator dropped unclosed is closed by its finalizer, Python code run as it dies.
    # A Ctrl-C just then (a second one, as the first unwinds the loop) is raised at the
    # finalizer's first bytecode, where Python prints it as ignored: the closing never
    # ran, and the workers ran on until the interpreter's exit.
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)  # (Python's report)
    loader = _loader(start_method)
    it = iter(loader)
    workers = _take_worker_pids(it)
    ctrl_c = CtrlCAsItDies(it)
    del it
    ctrl_c.drop()  # the iterator dies, a real SIGINT just before
    assert all(leaks.is_alive(worker) for worker in workers)  # its closing was cut short
    assert len(list(loader)) == len(Pids())  # the next iter() stops them, and runs whole
    _assert_torn_down(leak_check, workers)


@pytest.mark.slow  # spawn, as the conftest does with spawn variants: CI runs -m slow
@pytest.mark.parametrize(
    "when", ["preparing", "spawning", "handing_over", "supervising", "starting", "restarting"]
)
def test_ctrl_c_during_spawn_start_up_leaves_nothing_behind(when: str, tmp_path: Path) -> None:
    # "preparing": a real SIGINT the moment the first worker's pipes and shared memory
    # exist, before its process is started (those were left open: the start of a worker
    # was safe from Ctrl-C only inside Process.start); "spawning": the moment the first
    # worker process exists, before it got its instructions; "supervising": the moment
    # every worker is started, before the loop took charge of them (Ctrl-C about 0.3 s
    # into a start-up on a busy machine: a stack pipe was left open, and the workers ran
    # until exit); "starting": while iter() waits for workers still in worker_init_fn;
    # "handing_over": the moment the pool is made, before the loop holds it (its workers
    # ran on, their stack and parent-watch pipes open); "restarting": between a dead
    # worker let go and its replacement's start (teardown stumbled on the closed process
    # and left the other worker running). The program keeps the KeyboardInterrupt,
    # traceback and all.
    left, stderr = _run_script("interrupted_startup.py", "spawn", when, str(tmp_path))
    assert left == {"caught": 1, "frames": True, "alive": [], "fds": []}, stderr


@pytest.mark.slow  # one child interpreter, 31 spawned start-ups (about a minute)
@pytest.mark.timeout(600)
def test_ctrl_c_at_any_moment_of_a_spawn_start_up_leaves_nothing_behind() -> None:
    """A real SIGINT every 50 ms from 0 to 1.5 s after ``iter()`` (through the start-up,
    the workers' import of their modules on a busy machine included, into the first
    batches), each caught and kept: no process, descriptor, shared memory or /dev/shm
    file is left at any delay. (The moments above are hit on purpose; this sweep is for
    the ones nobody thought of: a leak was reported at 0.3 s that none of them hit.)"""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "interrupt_sweep.py"), "spawn", "0.05", "1.5"],
        capture_output=True, text=True, timeout=540, env=CHILD_ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(runs) == 31, done.stdout
    clean = {"caught": True, "alive": [], "fds": [], "maps": 0, "shm": []}
    left = [run for run in runs if {key: run[key] for key in clean} != clean]
    assert not left, "\n".join(json.dumps(run) for run in left) + "\n" + done.stderr
    assert runs[0]["where"] == "iter"  # the sweep begins inside the start-up


def _run_script(name: str, *args: str) -> tuple[dict[str, Any], str]:
    """Run a program from ``scripts/``; the JSON report on its last line, and its stderr."""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S,
        env=CHILD_ENV,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_iterator_workers_are_real_process_handles(start_method: str) -> None:
    """``it._workers``, which code written for torch reaches for, tells the truth about
    the worker processes, before and after conveyor shut them down."""
    it = iter(DataLoader(list(range(8)), num_workers=2, multiprocessing_context=start_method))
    next(it)
    workers = it._workers
    assert [w.is_alive() for w in workers] == [True, True]
    assert all(psutil.pid_exists(w.pid) for w in workers)
    del it
    for worker in workers:
        worker.join(10)
    assert [(w.is_alive(), w.exitcode) for w in workers] == [(False, 0), (False, 0)]


def test_shutdown_workers_stops_a_persistent_loaders_workers_like_torch() -> None:
    # Code written for torch stops a persistent loader's workers through its iterator
    # (torch's own DataPipe test does); the next epoch starts new ones.
    loader = DataLoader(list(range(6)), num_workers=2, persistent_workers=True)
    assert [b.item() for b in loader] == list(range(6))
    workers = loader._iterator._workers
    loader._iterator._shutdown_workers()
    for worker in workers:
        worker.join(10)
    assert [(w.is_alive(), w.exitcode) for w in workers] == [(False, 0), (False, 0)]
    loader._iterator = None
    assert [b.item() for b in loader] == list(range(6))


class LongPaths:
    """Sample ``i``: (a 4 KB path string, ``i``). Strings travel in the reply itself, and
    a batch of them (128 KB) is more than a pipe holds: a worker that sends one while
    the loop reads nothing blocks in the write."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> tuple[str, int]:
        return f"/data/{index:07d}/".ljust(4096, "x"), index


def test_workers_stop_when_asked_while_blocked_writing_into_a_full_result_pipe(
    start_method: str, leak_check: leaks.LeakSnapshot
) -> None:
    # Teardown used to queue its Stop behind the tasks already sent, and a worker blocked
    # writing a batch nobody reads never got to it: SIGTERM after 2 s. Now the workers see
    # the stop before their next task, and what they still send is read and dropped, so
    # each exits by itself.
    it = iter(
        DataLoader(LongPaths(), batch_size=32, num_workers=2, multiprocessing_context=start_method)
    )
    assert next(it)[1].tolist() == list(range(32))
    workers = it._workers
    del it
    assert [w.exitcode for w in workers] == [0, 0]  # not -15: nobody needed SIGTERM
    _assert_torn_down(leak_check, [])
