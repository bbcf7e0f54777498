"""What a worker is doing right now, readable by the main process at any time.

The first page of each worker's memfd holds a few int64 fields the worker
updates as it goes: which task, which stage, and (on a traced retry) which
sample of the batch. When a worker dies or stalls, the main process reads them
to say exactly where, without asking the worker anything.
"""

from __future__ import annotations

import functools
import time

from conveyor._task.protocol import Stage, WorkerStatus

STATUS_BYTES = 64


class _Field:
    """Positions of the int64 fields (plain ints: written several times per batch)."""

    EPOCH = 0
    SEQ = 1
    STAGE = 2
    POSITION = 3  # index of the sample within the batch, -1 when not traced
    STARTED_NS = 4  # CLOCK_MONOTONIC (system-wide on Linux) when the task began, or when
    # the worker went idle (a worker frozen between tasks shows how long it has been idle)
    STOP = 5  # written by the main process: nonzero once teardown began (see request_stop)
    # The thread serving the task (threads_per_worker > 1: several cores share a process):
    # threading.get_ident(), as a crash dump names the thread, and the kernel's thread id.
    THREAD = 6
    NATIVE_ID = 7


_STAGE_CODES: dict[Stage, int] = {stage: i + 1 for i, stage in enumerate(Stage)}
_CODE_STAGES: dict[int, Stage] = {code: stage for stage, code in _STAGE_CODES.items()}


class StatusWriter:
    """The worker's side."""

    def __init__(self, page: memoryview) -> None:
        # The main process marked the page "starting" (see mark_starting).
        self._fields = page[:STATUS_BYTES].cast("q")
        # The runner's check before each sample: C calls only (see Watcher.stop_check).
        self.stop_check = functools.partial(self._fields.__getitem__, _Field.STOP)

    def begin(self, epoch: int, seq: int) -> None:
        f = self._fields
        f[_Field.EPOCH] = epoch
        f[_Field.SEQ] = seq
        f[_Field.POSITION] = -1
        f[_Field.STARTED_NS] = time.monotonic_ns()
        f[_Field.STAGE] = _STAGE_CODES[Stage.FETCH]

    def stage(self, stage: Stage) -> None:
        self._fields[_Field.STAGE] = _STAGE_CODES[stage]

    def position(self, position: int) -> None:
        self._fields[_Field.POSITION] = position

    def idle(self) -> None:
        self._fields[_Field.STARTED_NS] = time.monotonic_ns()
        self._fields[_Field.STAGE] = 0

    def stop_requested(self) -> bool:
        return self._fields[_Field.STOP] != 0

    def thread(self, ident: int, native_id: int) -> None:
        """Which thread serves this core (one of several in its process)."""
        self._fields[_Field.THREAD] = ident
        self._fields[_Field.NATIVE_ID] = native_id


def request_stop(page: memoryview) -> None:
    """The main process's side of teardown: the worker runs no task it has not begun.

    A Stop message waits in the task pipe behind every task already sent (with small
    batches running ahead, hundreds); this flag is seen before the next one."""
    page[:STATUS_BYTES].cast("q")[_Field.STOP] = 1


def mark_starting(page: memoryview) -> None:
    """The main process's first word on a new worker's page, before it exists: it
    is starting up, since now (a zeroed page would read as idle since boot)."""
    writer = StatusWriter(page)
    writer.begin(-1, -1)
    writer.stage(Stage.STARTUP)


def read_status(page: memoryview) -> WorkerStatus:
    """The main process's side: a snapshot of the worker's fields."""
    f = page[:STATUS_BYTES].cast("q")
    stage = _CODE_STAGES.get(f[_Field.STAGE])
    age = (time.monotonic_ns() - f[_Field.STARTED_NS]) / 1e9
    return WorkerStatus(
        f[_Field.EPOCH],
        f[_Field.SEQ],
        stage,
        f[_Field.POSITION],
        age,
        f[_Field.THREAD],
        f[_Field.NATIVE_ID],
    )


class MemoryStatus:
    """A status sink in this process's memory, for cores that share it (thread workers,
    the loop's fake pool): a status page's fields, read with :meth:`read`."""

    def __init__(self) -> None:
        self._epoch = self._seq = self._position = -1
        self._stage: Stage | None = Stage.STARTUP
        self._started_ns = time.monotonic_ns()
        self.stopping = False  # set by the main side: no task not yet begun is run
        self.stop_check = functools.partial(getattr, self, "stopping")  # (C calls only)

    def begin(self, epoch: int, seq: int) -> None:
        self._epoch, self._seq, self._position = epoch, seq, -1
        self._started_ns = time.monotonic_ns()
        self._stage = Stage.FETCH

    def stage(self, stage: Stage) -> None:
        self._stage = stage

    def position(self, position: int) -> None:
        self._position = position

    def idle(self) -> None:
        self._started_ns = time.monotonic_ns()
        self._stage = None

    def stop_requested(self) -> bool:
        return self.stopping

    def read(self) -> WorkerStatus:
        age = (time.monotonic_ns() - self._started_ns) / 1e9
        return WorkerStatus(self._epoch, self._seq, self._stage, self._position, age)
