"""Dead workers and bad samples: replace, re-send, find the poison sample, skip.

A mixin of MultiprocessIterator; see docs/design.md, "Supervision".
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING

from .._transport.codec import SlotPayload
from .._workers.exits import describe_exit
from .._workers.pool import Worker
from .._workers.protocol import BatchDone, SampleFailed, Stage, Task
from .._workers.remote_error import rebuild
from .._workers.status import WorkerStatus, read_status
from ..errors import (
    WorkerContext,
    WorkerCrashedError,
    WorkerRestartedWarning,
    add_note,
    attach_worker_context,
)
from .tasks import Done, IteratorState, Outstanding, indices_of, short


class Recovery(IteratorState):
    """Replaces dead workers and keeps the record of skipped samples."""

    if TYPE_CHECKING:

        def _drain(self, worker: Worker) -> None: ...

    # --- bad samples -------------------------------------------------------

    def _record_skips(
        self, failures: tuple[SampleFailed, ...], worker: Worker, message: BatchDone
    ) -> None:
        for failure in failures:
            error = failure.error
            self._skips.record(
                failure.index,
                worker.worker_id,
                failure.stage.value,
                f"{error.module}.{error.qualname}",
                error.message,
            )
        if self._skips.over_budget():
            raise self._skip_budget_error(failures[-1], worker, message)

    def _skip_budget_error(
        self, failure: SampleFailed, worker: Worker, message: BatchDone
    ) -> BaseException:
        exc = rebuild(failure.error)
        context = WorkerContext(
            worker_id=worker.worker_id,
            pid=worker.pid or -1,
            stage=failure.stage.value,
            indices=(failure.index,),
            traceback=failure.error.traceback,
            epoch=message.epoch,
            seq=message.seq,
        )
        attach_worker_context(exc, context)
        add_note(exc, self._skips.budget_note())
        return exc

    # --- dead workers ------------------------------------------------------

    def _recover(self, worker: Worker) -> None:
        """Replace a dead worker and re-send what it had not answered."""
        self._drain(worker)
        worker.process.join(timeout=1.0)
        status = read_status(worker.arena.status_page)
        held = sorted(
            seq
            for seq, t in self._outstanding.items()
            if t.worker_id == worker.worker_id and seq not in self._results
        )
        culprit = self._culprit(status, held)

        def give_up(note: str) -> WorkerCrashedError:
            return self._crash_error(worker, status, held, culprit, note=note)

        if self._iterable:
            raise give_up(
                "An iterable-style dataset's iterator cannot be resumed in a new process, "
                "so conveyor does not restart workers for it."
            )
        counters = self._counters[worker.worker_id]
        if status.stage in (Stage.STARTUP, Stage.WORKER_INIT):
            counters.init_crashes += 1
            if counters.init_crashes >= 2:
                raise give_up(
                    "It died the same way in its replacement, before any task: this is not "
                    "a passing failure."
                )
        if culprit is not None:
            task = self._outstanding[culprit]
            task.crashes += 1
            if task.crashes >= 2:
                self._handle_poison(worker, status, held, culprit, task)
        if self._restarts >= self._policy.max_worker_restarts:
            raise give_up(
                f"The restart budget is spent (max_worker_restarts="
                f"{self._policy.max_worker_restarts}); raise it to tolerate more crashes."
            )
        self._restarts += 1
        counters.restarts += 1
        # Batches this worker finished but the user has not taken yet live in its
        # memfd: map them now, before the pool closes our handle on it.
        worker.arena.map_all(
            [
                d.message.payload.slot
                for d in self._results.values()
                if d.worker is worker
                and isinstance(d.message, BatchDone)
                and isinstance(d.message.payload, SlotPayload)
            ]
        )
        summary = self._death_summary(worker, status, held, culprit)
        self._killed_stuck.pop(worker.worker_id, None)
        replacement = self._pool.replace(worker.worker_id)
        resent = 0
        for seq in held:
            if seq in self._results:
                continue  # settled by the poison handling
            task = self._outstanding[seq]
            task.sent_at = time.monotonic()
            task.stall_reported = False
            replacement.send(
                Task(self._epoch, seq, task.index, trace=seq == culprit, exclude=task.exclude)
            )
            resent += 1
        self._retried += resent
        warnings.warn(
            f"{summary} Started a replacement "
            f"(restart {self._restarts} of {self._policy.max_worker_restarts}) and re-sent its "
            f"{resent} unanswered task(s); no sample is lost or repeated.",
            WorkerRestartedWarning,
            stacklevel=5,
        )

    def _exit_reason(self, worker: Worker) -> str:
        stuck = self._killed_stuck.get(worker.worker_id)
        return stuck if stuck is not None else describe_exit(worker.process.exitcode)

    def _culprit(self, status: WorkerStatus, held: list[int]) -> int | None:
        """The task the worker was running when it died."""
        if status.stage in (Stage.FETCH, Stage.COLLATE, Stage.TRANSFER):
            if status.epoch == self._epoch and status.seq in held:
                return status.seq
            return None
        return None

    def _handle_poison(
        self,
        worker: Worker,
        status: WorkerStatus,
        held: list[int],
        culprit: int,
        task: Outstanding,
    ) -> None:
        """The same task killed its worker twice: find the sample, skip or raise."""
        indices = indices_of(task.index, self._iterable)
        poison = None
        if status.stage is Stage.FETCH and 0 <= status.position < len(indices):
            poison = indices[status.position]
        if self._policy.on_error != "skip":
            raise self._crash_error(
                worker,
                status,
                held,
                culprit,
                note=(
                    (
                        f"Dataset index {poison!r} killed its worker twice (the first time, and "
                        "again on retry): that sample is the cause, not the machine. Fix the "
                        "sample, or pass on_error='skip' to leave it out."
                    )
                    if poison is not None
                    else "This batch killed its worker twice (the first time, and again on "
                    "retry), outside fetching samples; pass on_error='skip' to leave it out."
                ),
            )
        why = f"killed its worker twice: {self._exit_reason(worker)}"
        lost = (
            (poison,) if poison is not None else tuple(i for i in indices if i not in task.exclude)
        )
        for index in lost:
            self._skips.record(
                index, worker.worker_id, "crash", "conveyor.errors.WorkerCrashedError", why
            )
        if poison is not None:
            task.exclude = (*task.exclude, poison)
            task.crashes = 0
        else:  # nothing left to retry: settle the task as an empty batch
            self._results[culprit] = Done(BatchDone(self._epoch, culprit, None), worker)
        if self._skips.over_budget():
            note = self._skips.budget_note()
            raise self._crash_error(worker, status, held, culprit, note=note)

    def _death_summary(
        self, worker: Worker, status: WorkerStatus, held: list[int], culprit: int | None
    ) -> str:
        exit_text = self._exit_reason(worker)
        where = ""
        if status.stage is not None:
            where = f" during {status.stage.value}"
            if culprit is not None:
                task = self._outstanding[culprit]
                indices = indices_of(task.index, self._iterable)
                where += f" of batch {culprit} (dataset indices {short(indices)})"
                if 0 <= status.position < len(indices) and status.stage is Stage.FETCH:
                    where += f", at dataset index {indices[status.position]!r}"
        holding = [
            i for seq in held for i in indices_of(self._outstanding[seq].index, self._iterable)
        ]
        held_text = f" It held dataset indices {short(tuple(holding))}." if holding else ""
        return (
            f"DataLoader worker {worker.worker_id} (pid {worker.pid}) exited "
            f"unexpectedly{where}: {exit_text}.{held_text}"
        )

    def _crash_error(
        self,
        worker: Worker,
        status: WorkerStatus,
        held: list[int],
        culprit: int | None,
        note: str,
    ) -> WorkerCrashedError:
        indices = tuple(
            i for seq in held for i in indices_of(self._outstanding[seq].index, self._iterable)
        )
        return WorkerCrashedError(
            f"{self._death_summary(worker, status, held, culprit)} {note}",
            worker_id=worker.worker_id,
            pid=worker.pid,
            exitcode=worker.process.exitcode,
            indices=indices,
        )
