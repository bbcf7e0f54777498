"""One table of faults: what goes wrong, by where it happens, by start method.

Faults (rows):

* ``raise``: user code raises ``InjectedError``;
* ``SIGKILL``, ``SIGSEGV`` (``ctypes.string_at(0)``), ``exit3`` (``os._exit(3)``): the
  worker dies;
* ``hang``: ``time.sleep(60)``, with ``timeout=2`` and either ``on_timeout="restart"``
  (the stuck worker is killed and its task retried) or the default ``"raise"``.

Stages (columns): ``worker_init`` (``worker_init_fn``), ``fetch`` (``__getitem__`` of
dataset index 3), ``collate`` (``collate_fn`` of the batch holding index 3) and
``transfer`` (pickling the batch back: sample 3's ``__reduce__``, which runs in the
worker while the batch is pickled) happen in the worker. Two more happen in the main
process: ``decode`` (rebuilding the batch: sample 3 pickles in the worker but its
rebuild fails here) and ``teardown`` (stopping the workers).

Each deadly fault runs twice: **once** (the faulting process creates a marker file in
``tmp_path`` first, and a fault whose marker exists does not fire, so the retry
succeeds) and **always**. Outcomes asserted:

* once → recovered: every dataset index exactly once and in order, one
  ``WorkerRestartedWarning`` naming the signal or exit code and the stage, one restart
  in ``loader.statistics()``;
* always → the named error: ``WorkerCrashedError`` naming the dataset index (fetch:
  once it also killed a fresh worker alone), the batch (collate, transfer) or
  ``worker_init``, after a restart warning per death before it;
* ``raise`` is never retried (torch's semantics: the error is the answer), so it has one
  mode: the same exception type, with the worker, stage, indices and worker traceback
  in ``conveyor_context``, and (after a task's error) the loop goes on with the next
  batch, as torch's does.
* ``hang`` without restart → ``WorkerTimeoutError`` with the stage and the worker's stack.
* ``decode``: ``raise`` is that batch's error (the same type, stage ``decode``, the
  loop goes on); a crash there (SIGKILL, SIGSEGV, ``os._exit(3)``) is the main
  process's own death, run in a child program: its workers die with it.
* ``teardown``: the fault is an ``interrupt``, a real SIGINT that arrives while
  teardown waits for a busy worker (after a first one stopped the loop): held back
  until teardown is complete, then acted on by the program's own handler; nothing
  is left, pipes included.

The dataset has 8 samples, ``batch_size=2``, 1 worker: batch 1 is ``[2, 3]``.
The autouse ``leak_check`` fixture (conftest.py) asserts after every case that no
process, conveyor memfd or /dev/shm file outlived it.

Which cells run: all 40 under ``fork`` (a fork worker starts in milliseconds). Under
``spawn`` (each worker imports torch, 1-3 s) and ``forkserver`` (cheap after its
server starts, but the same code as spawn in the worker) the cells whose code path
depends on how the worker was started: SIGKILL (once and always) and raise at every
stage (decode included), plus one hang (fetch, restart, once), a crash while decoding (SIGKILL)
and an interrupt during teardown. SIGSEGV and exit codes differ from SIGKILL
only in the exit status, which the sentinel reports the same way under every start
method; the hang cells cost 2-5 s each, so one per method shows that the stack dump and
kill work there.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import pytest

from conveyor import (
    DataLoader,
    WorkerCrashedError,
    WorkerRestartedWarning,
    WorkerTimeoutError,
)
from conveyor._workers import pool as pool_module
from conveyor._workers import teardown as teardown_steps
from tests.helpers import leaks
from tests.helpers.interrupts import in_pool_teardown, open_fds
from tests.helpers.sync import Mailbox, post

pytestmark = pytest.mark.timeout(60)

STAGES = ("worker_init", "fetch", "collate", "transfer")
DEADLY = ("SIGKILL", "SIGSEGV", "exit3", "hang")
BAD = 3  # the dataset index that faults; batch 1 = [2, 3]
ALL_INDICES = [[0, 1], [2, 3], [4, 5], [6, 7]]
TIMEOUT = 2
# A worker started afresh (spawn, forkserver) imports torch before its first task, and a
# task not started counts against timeout (as in torch): on CI's busy cores that start
# took over 2 s, and the worker was killed as stuck before the hang.
STARTED_AFRESH_TIMEOUT = 6
SCRIPTS = Path(__file__).parent / "scripts"
STARTUP_TIMEOUT_S = 60.0  # a child program importing torch on busy cores

EXIT_TEXT = {
    "SIGKILL": "killed by signal SIGKILL (-9)",
    "SIGSEGV": "killed by signal SIGSEGV (-11)",
    "exit3": "exit code 3",
    "hang": "so conveyor killed it",
}
EXIT_CODE = {"SIGKILL": -9, "SIGSEGV": -11, "exit3": 3, "hang": -9}


class InjectedError(Exception):
    """What the ``raise`` fault raises."""


@dataclass(frozen=True)
class Fault:
    """A fault and when it fires: ``marker`` empty → always; else only while it is absent."""

    how: str
    marker: str = ""

    def fire(self) -> None:
        if self.marker:
            if os.path.exists(self.marker):
                return
            Path(self.marker).touch()  # before dying: the retry must see it
        if self.how == "raise":
            raise InjectedError(f"injected fault at dataset index {BAD}")
        if self.how == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.how == "SIGSEGV":
            faulthandler.disable()  # pytest's, inherited by fork: keep the output clean
            ctypes.string_at(0)
        elif self.how == "exit3":
            os._exit(3)
        elif self.how == "hang":
            time.sleep(60)


class Token:
    """A sample; pickling it (sending the batch back) fires ``fault`` if it has one, or
    with ``on_decode``, rebuilding it in the main process does."""

    def __init__(self, value: int, fault: Fault | None = None, on_decode: bool = False) -> None:
        self.value = value
        self.fault = fault
        self.on_decode = on_decode

    def __reduce__(self) -> tuple[Any, ...]:
        if self.fault is not None and self.on_decode:
            return (_rebuilt, (self.value, self.fault))
        if self.fault is not None:
            self.fault.fire()
        return (Token, (self.value,))


def _rebuilt(value: int, fault: Fault) -> Token:
    """Unpickles a decode-stage Token: runs where the batch is rebuilt, the main process."""
    fault.fire()
    return Token(value)


class Samples:
    """``dataset[i]`` is ``Token(i)``; index ``BAD`` faults in fetch or in transfer."""

    def __init__(self, fault: Fault | None, stage: str, length: int = 8) -> None:
        self.fault = fault
        self.stage = stage
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Token:
        if index == BAD and self.fault is not None:
            if self.stage == "fetch":
                self.fault.fire()
            elif self.stage in ("transfer", "decode"):
                return Token(index, self.fault, on_decode=self.stage == "decode")
        return Token(index)


@dataclass(frozen=True)
class Collate:
    """Keeps the batch a list of tokens; faults on the batch holding ``BAD``."""

    fault: Fault | None = None

    def __call__(self, batch: list[Token]) -> list[Token]:
        if self.fault is not None and any(t.value == BAD for t in batch):
            self.fault.fire()
        return list(batch)


@dataclass(frozen=True)
class WorkerInit:
    fault: Fault

    def __call__(self, worker_id: int) -> None:
        self.fault.fire()


def _loader(how: str, stage: str, start_method: str, marker: str = "", **kwargs: Any) -> DataLoader:
    fault = Fault(how, marker)
    return DataLoader(
        Samples(fault, stage),
        batch_size=2,
        num_workers=1,
        multiprocessing_context=start_method,
        collate_fn=Collate(fault if stage == "collate" else None),
        worker_init_fn=WorkerInit(fault) if stage == "worker_init" else None,
        **kwargs,
    )


def _values(batch: list[Token]) -> list[int]:
    return [t.value for t in batch]


def _hang_options(how: str, start_method: str, on_timeout: str = "restart") -> dict[str, Any]:
    if how != "hang":
        return {}
    timeout = TIMEOUT if start_method == "fork" else STARTED_AFRESH_TIMEOUT
    return {"timeout": timeout, "on_timeout": on_timeout}


def _where(stage: str) -> str:
    """How the crash message says where the worker was."""
    if stage == "worker_init":
        return "during worker_init"
    return f"during {stage} of batch 1 (dataset indices [2, 3])"


# --- which cells run ------------------------------------------------------------

EXPENSIVE_METHODS = ("forkserver", "spawn")
SLOW = (pytest.mark.slow,)


def _deadly_cells(*, repeated: bool = False) -> list[Any]:
    cells = [("fork", how, stage) for how in DEADLY for stage in STAGES]
    cells += [(m, "SIGKILL", stage) for m in EXPENSIVE_METHODS for stage in STAGES]
    return [
        pytest.param(*cell, id="-".join(cell), marks=_slow_hang(*cell, repeated=repeated))
        for cell in cells
    ]


def _slow_hang(start_method: str, how: str, stage: str, *, repeated: bool) -> Any:
    """A real hang waits out a timeout: the default run keeps the fetch stage of a hang
    that happens once, the rest (the same code path on the main side; a hang every time
    waits out one timeout per restart and one more to prove the sample) run with
    ``-m slow``."""
    return pytest.mark.slow if how == "hang" and (stage != "fetch" or repeated) else ()


def _raise_cells() -> list[Any]:
    cells = [
        pytest.param(m, stage, id=f"{m}-raise-{stage}")
        for m in ("fork", *EXPENSIVE_METHODS)
        for stage in (*STAGES, "decode")
        if stage != "transfer"
    ]
    cells.append(pytest.param("fork", "transfer", id="fork-raise-transfer"))
    return cells


# --- once: recovered ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("start_method", "how", "stage"),
    [
        *_deadly_cells(),
        *(pytest.param(m, "hang", "fetch", id=f"{m}-hang-fetch") for m in EXPENSIVE_METHODS),
    ],
)
def test_fault_once_is_recovered(start_method: str, how: str, stage: str, tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    loader = _loader(how, stage, start_method, str(marker), **_hang_options(how, start_method))

    with pytest.warns(WorkerRestartedWarning) as record:
        batches = [_values(b) for b in loader]

    assert marker.exists()  # the fault did fire
    assert batches == ALL_INDICES  # every index once, in order
    assert [type(w.message) for w in record] == [WorkerRestartedWarning]
    message = str(record[0].message)
    assert "DataLoader worker 0 (pid " in message
    assert EXIT_TEXT[how] in message
    assert _where(stage) in message
    assert "restart 1 of 3" in message
    stats = loader.statistics()
    assert stats is not None
    assert stats.worker_restarts == 1
    assert stats.tasks_retried >= 1
    assert stats.samples_skipped == 0
    assert stats.workers[0].restarts == 1


# --- always: the named error -----------------------------------------------------------


@pytest.mark.parametrize(("start_method", "how", "stage"), _deadly_cells(repeated=True))
def test_fault_always_is_named(start_method: str, how: str, stage: str) -> None:
    loader = _loader(how, stage, start_method, **_hang_options(how, start_method))
    received = []

    with (
        pytest.warns(WorkerRestartedWarning) as record,
        pytest.raises(WorkerCrashedError) as info,
    ):
        for batch in loader:
            received.append(_values(batch))

    # A sample is named only once it killed a fresh worker alone too: a death of its
    # own (or conveyor's own kill of a stuck worker) once more, a SIGKILL (which may
    # come from outside: the OOM killer) twice more. A batch that dies outside
    # fetching is proven by deaths in a row: two of its own, three SIGKILLs. Start-up
    # deaths by SIGKILL are bounded by the restart budget (3) alone.
    outside = how == "SIGKILL"
    if stage == "fetch":
        deaths = 4 if outside else 3
    else:
        deaths = (4 if stage == "worker_init" else 3) if outside else 2
    assert [type(w.message) for w in record] == [WorkerRestartedWarning] * (deaths - 1)
    assert EXIT_TEXT[how] in str(record[0].message)
    exc = info.value
    message = str(exc)
    assert (exc.worker_id, exc.exitcode) == (0, EXIT_CODE[how])
    assert f"DataLoader worker 0 (pid {exc.pid}) exited unexpectedly" in message
    assert EXIT_TEXT[how] in message
    assert _where(stage) in message
    times = "twice" if deaths == 2 else f"{deaths} times"
    if stage == "worker_init":
        assert received == []
        if outside:
            assert "The restart budget is spent (max_worker_restarts=3)" in message
        else:
            assert "It died the same way in its replacement" in message
    else:
        assert received == ALL_INDICES[:1]
        assert BAD in exc.indices
        if stage == "fetch":
            assert f"Dataset index {BAD} killed its worker {times}, the last" in message
            assert f"at dataset index {BAD} (tried alone in a fresh worker)" in message
        else:
            assert f"This batch killed its worker {times}" in message


# --- raise: same type, where it happened ---------------------------------------------


def _raised(it: Any) -> BaseException:
    """``next(it)``'s exception, without its traceback: a failed assertion on it must not
    keep the iterator's frames (and its workers' memory maps) alive past the leak check."""
    return _raised_by(lambda: next(it))


def _raised_by(call: Any) -> BaseException:
    try:
        call()
    except Exception as exc:
        exc.__traceback__ = None
        return exc
    raise AssertionError(f"{call} did not raise")


@pytest.mark.parametrize(("start_method", "stage"), _raise_cells())
def test_raise_keeps_its_type_and_says_where(start_method: str, stage: str) -> None:
    loader = _loader("raise", stage, start_method)
    received = []
    if stage == "worker_init":
        # iter() returns once every worker started (as torchdata's loader does), so a
        # worker_init_fn error is raised there.
        exc = _raised_by(lambda: iter(loader))
    else:
        it = iter(loader)
        received.append(_values(next(it)))
        exc = _raised(it)
        received += [_values(b) for b in it]  # like torch, the loop goes on with the next batch
        del it

    assert received == ([] if stage == "worker_init" else [ALL_INDICES[0], *ALL_INDICES[2:]])
    assert isinstance(exc, InjectedError), repr(exc)
    assert str(exc) == f"injected fault at dataset index {BAD}"
    context = exc.conveyor_context  # type: ignore[attr-defined]
    assert (context.worker_id, context.stage) == (0, stage)
    assert context.indices == (() if stage == "worker_init" else (2, 3))
    if stage == "decode":  # raised here, in the main process: no worker traceback
        assert context.traceback == ""
        assert any("could not be rebuilt in the main process" in n for n in exc.__notes__)
    else:
        assert "in fire" in context.traceback
        assert "InjectedError: injected fault" in context.traceback


@pytest.mark.parametrize("start_method", ["fork", *EXPENSIVE_METHODS])
def test_raise_while_sending_is_reported_at_once(start_method: str) -> None:
    it = iter(_loader("raise", "transfer", start_method))
    assert _values(next(it)) == ALL_INDICES[0]

    exc = _raised(it)  # InjectedError, whatever the stage
    del it

    context = exc.conveyor_context  # type: ignore[attr-defined]
    assert (context.worker_id, context.stage, context.indices) == (0, "transfer", (2, 3))
    assert f"InjectedError: injected fault at dataset index {BAD}" in context.traceback
    assert "in __reduce__" in context.traceback


# --- hang without restart: WorkerTimeoutError ----------------------------------------------


@pytest.mark.parametrize(
    "stage", [pytest.param(s, marks=() if s == "fetch" else pytest.mark.slow) for s in STAGES]
)
def test_hang_without_restart_times_out(stage: str) -> None:
    loader = _loader("hang", stage, "fork", **_hang_options("hang", "fork", on_timeout="raise"))
    received = []

    with pytest.raises(WorkerTimeoutError) as info:
        for batch in loader:
            received.append(_values(batch))

    message = str(info.value)
    assert f"DataLoader timed out after {TIMEOUT} seconds: worker 0 (pid " in message
    assert f"in stage {stage}" in message
    assert "The worker's current Python stack" in message
    # Raised while the worker was stuck, not after the 60 s sleep: its stack, taken
    # when the timeout expired, shows it still there.
    assert "in fire" in message
    stats = loader.statistics()
    assert stats is not None
    assert (stats.worker_restarts, stats.tasks_retried) == (0, 0)  # raised, not retried
    if stage == "worker_init":
        assert received == []
    else:
        assert received == ALL_INDICES[:1]
        assert "batch 1 (dataset indices [2, 3])" in message


# --- decode: the batch cannot be rebuilt in the main process --------------------------


def _decode_crash_cells() -> list[Any]:
    cells = [("fork", how) for how in ("SIGKILL", "SIGSEGV", "exit3")]
    cells += [(m, "SIGKILL") for m in EXPENSIVE_METHODS]
    # The default run keeps a crash of its own (SIGSEGV); the rest run with -m slow.
    return [
        pytest.param(m, how, id=f"{m}-{how}-decode", marks=() if how == "SIGSEGV" else SLOW)
        for m, how in cells
    ]


@pytest.mark.parametrize(("start_method", "how"), _decode_crash_cells())
def test_crash_while_decoding_takes_the_workers_along(
    start_method: str, how: str, leak_check: leaks.LeakSnapshot
) -> None:
    # Rebuilding sample 3 kills the main process itself (a child program here): a
    # crash of the user's own process, which conveyor cannot survive; its workers
    # must not outlive it.
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "decode_crash.py"), start_method, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = child.communicate(timeout=STARTUP_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    lines = out.splitlines()
    assert lines and lines[0].startswith("PIDS "), f"stdout {out!r}, stderr:\n{err}"
    workers = []
    for pid in lines[0].split()[1:]:
        try:
            workers.append(psutil.Process(int(pid)))
        except psutil.NoSuchProcess:
            continue  # gone already, as wanted
    assert lines[1:] == ["[0, 1]"], err  # the first batch, then the crash in decode
    assert child.returncode == EXIT_CODE[how], err
    survivors = leaks.wait_gone(workers, 5.0)
    assert not survivors, "workers outlived their main process:\n" + leaks.describe(survivors)
    assert leaks.new_shm_entries(leak_check) == []


# --- teardown: Ctrl-C while the workers are being stopped ---------------------------------


class Interrupted(Exception):
    """What this test's SIGINT handler raises: a KeyboardInterrupt would end pytest's run."""


class StuckAt:
    """``dataset[i] == i``; ``dataset[BAD]`` posts to a mailbox, then sleeps 60 s (busy:
    it will not read Stop, and teardown must wait out its grace period)."""

    def __init__(self, mailbox: str) -> None:
        self.mailbox = mailbox

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == BAD:
            post(self.mailbox, str(os.getpid()))
            time.sleep(60)
        return index


def _helper_fds() -> set[int]:
    """Descriptors multiprocessing keeps for the interpreter's life (fork server, resource
    tracker), opened the first time a test needs them."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    server = multiprocessing.forkserver._forkserver  # type: ignore[attr-defined]
    tracker = multiprocessing.resource_tracker._resource_tracker  # type: ignore[attr-defined]
    return {
        fd
        for fd in (getattr(server, "_forkserver_alive_fd", None), getattr(tracker, "_fd", None))
        if fd is not None
    }


@contextmanager
def _sigint_noted(
    watched: list[psutil.Process],
) -> Iterator[list[tuple[bool, int]]]:
    """This program's SIGINT handler for the block: it notes whether the signal arrived
    during teardown and how many of ``watched`` were running when it ran, then raises
    ``Interrupted``."""
    noted: list[tuple[bool, int]] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        noted.append((in_pool_teardown(frame), sum(leaks.is_alive(w) for w in watched)))
        raise Interrupted

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("start_method", ["fork", *EXPENSIVE_METHODS])
def test_interrupt_during_teardown_is_held_back_until_nothing_is_left(
    start_method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first SIGINT stops the loop while it waits for a batch; a second arrives while
    # teardown waits for the busy worker. Both are real signals, each sent at a known
    # point (from inside the pool's wait, then from inside teardown's wait).
    def interrupt_once(where: Any, name: str) -> None:
        original = getattr(where, name)

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(where, name, original)
            os.kill(os.getpid(), signal.SIGINT)
            return original(*args, **kwargs)

        monkeypatch.setattr(where, name, interrupted)

    before = open_fds()
    watched: list[psutil.Process] = []
    with Mailbox(tmp_path / "stuck") as box, _sigint_noted(watched) as noted:
        loader = DataLoader(
            StuckAt(box.path), batch_size=2, num_workers=1, collate_fn=list,
            multiprocessing_context=start_method,
        )  # fmt: skip
        it = iter(loader)
        assert next(it) == [0, 1]
        watched.append(psutil.Process(int(box.wait())))  # in dataset[3] now: busy
        interrupt_once(pool_module.WorkerPool, "wait")
        interrupt_once(teardown_steps, "_wait_for_stop")
        with pytest.raises(Interrupted) as info:
            next(it)
        del it

    # The first arrived while the loop waited, the worker running; the second during
    # teardown, acted on only once the worker was gone.
    assert noted == [(False, 1), (True, 0)]
    assert isinstance(info.value.__context__, Interrupted)  # the first, then the second
    left = {fd: path for fd, path in open_fds().items() if before.get(fd) != path}
    for fd in _helper_fds():
        left.pop(fd, None)
    assert left == {}, "descriptors left open (pipes, memfds, sockets)"
