"""The samples an epoch leaves out under ``on_error="skip"``, and its budget."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._task.protocol import RemoteError, SampleFailed
from .._task.rebuild import rebuild
from .._task.supervision import SupervisionPolicy
from ..errors import Culprit, WorkerContext, WorkerCrashedError, add_note, attach_worker_context
from ..records import SkippedSample
from . import messages

if TYPE_CHECKING:
    from .._task.runner import LeftOut

log = logging.getLogger("conveyor")
CRASH_TYPE = "conveyor.errors.WorkerCrashedError"  # what a sample left out for a crash raised


@dataclass
class LeftOutNote:
    """A sample left out of a task's batch, recorded when the batch is handed out."""

    index: Any
    worker_id: int | None  # None: the training thread (num_workers=0)
    stage: str
    exception_type: str
    message: str
    remote: RemoteError | None = None  # the worker's exception (None: a crash)
    raised: BaseException | None = None  # the exception itself, raised in this thread


def notes_of(worker_id: int, skipped: tuple[SampleFailed, ...]) -> list[LeftOutNote]:
    """What a worker says it left out of a batch."""
    return [
        LeftOutNote(
            s.index,
            worker_id,
            s.stage.value,
            f"{s.error.module}.{s.error.qualname}",
            s.error.message,
            s.error,
        )
        for s in skipped
    ]


def notes_here(left_out: Iterable[LeftOut]) -> list[LeftOutNote]:
    """What the training thread left out of a batch (``num_workers=0``)."""
    return [
        LeftOutNote(item.index, None, item.stage.value, type_path(item.error),
                    str(item.error), raised=item.error)
        for item in left_out
    ]  # fmt: skip


def crash_notes(
    indices: tuple[Any, ...], worker_id: int, stage: str, why: str
) -> list[LeftOutNote]:
    """Samples left out for killing their worker (``stage`` "crash" or "killed")."""
    return [LeftOutNote(i, worker_id, stage, CRASH_TYPE, why) for i in indices]


class SkipLedger:
    """Appends to the loader's log (so records outlive iterators) and counts per epoch."""

    def __init__(self, records: list[SkippedSample], policy: SupervisionPolicy) -> None:
        self.records = records
        self._policy = policy
        self.epoch = 0
        self._epoch_start = len(records)
        self._budget: int | None = None
        self.poison = {s.index for s in records if s.stage == "crash"}  # they kill workers

    def start_epoch(self, epoch: int, epoch_samples: int | None) -> None:
        self.epoch = epoch
        self._epoch_start = len(self.records)
        self._budget = self._policy.error_budget(epoch_samples)

    def record(
        self, index: Any, worker_id: int | None, stage: str, exception_type: str, message: str
    ) -> None:
        self.records.append(
            SkippedSample(index, self.epoch, worker_id, stage, exception_type, message)
        )

    def record_notes(
        self, notes: list[LeftOutNote], seq: int, indices: tuple[Any, ...]
    ) -> BaseException | None:
        """Record the samples left out of the batch at ``seq`` (dataset ``indices``), as
        it is handed out; the error to raise if that spends the budget (the sample's own,
        or a crash's)."""
        for note in notes:
            self.record(note.index, note.worker_id, note.stage, note.exception_type, note.message)
            if self.over_budget():
                return budget_error(note, self.budget_note(), self.epoch, seq, indices)
        return None

    @property
    def has_poison(self) -> bool:
        return bool(self.poison)

    def mark_poison(self, indices: tuple[Any, ...]) -> None:
        """Samples found to kill workers: left out of every later task, at once."""
        self.poison.update(indices)

    def left_out_up_front(
        self, indices: tuple[Any, ...], worker_id: int
    ) -> tuple[tuple[Any, ...], list[LeftOutNote]]:
        """Of a new task's samples, those that killed their worker in an earlier epoch:
        left out without trying again, and recorded again for this epoch."""
        exclude = tuple(i for i in indices if i in self.poison)
        return exclude, crash_notes(exclude, worker_id, "crash", messages.LEFT_OUT_AGAIN)

    @property
    def lost_this_epoch(self) -> int:
        return len(self.records) - self._epoch_start

    def over_budget(self) -> bool:
        return self._budget is not None and self.lost_this_epoch > self._budget

    def budget_note(self) -> str:
        return (
            f"on_error='skip' gave up: {self.lost_this_epoch} samples skipped in epoch "
            f"{self.epoch}, more than max_errors={self._policy.max_errors!r} allows "
            f"({self._budget} samples). The skipped samples are in loader.skipped_samples. "
            "Fix the dataset, or raise max_errors if losing them is acceptable."
        )

    def log_epoch_summary(self) -> None:
        skipped = self.records[self._epoch_start :]
        if not skipped:
            return
        shown = ", ".join(
            f"{s.index!r} ({s.exception_type.rsplit('.', 1)[-1]})" for s in skipped[:10]
        )
        log.warning(
            "Epoch %d: skipped %d sample(s) under on_error='skip': %s%s. "
            "All are in loader.skipped_samples.",
            self.epoch,
            len(skipped),
            shown,
            ", ..." if len(skipped) > 10 else "",
        )


def budget_error(
    note: LeftOutNote, budget_note: str, epoch: int, seq: int, indices: tuple[Any, ...]
) -> BaseException:
    """The left-out sample that spent the skip budget (of the batch at ``seq``, with
    dataset ``indices``): its own exception, or the crash it caused."""
    remote = note.remote
    if remote is None and note.raised is None:
        return WorkerCrashedError(
            messages.crash_over_budget(note.index, note.message, budget_note),
            worker_id=note.worker_id,
            indices=(note.index,),
        )
    context = WorkerContext(
        worker_id=note.worker_id,
        pid=None if note.worker_id is None else -1,
        stage=note.stage,
        indices=indices,
        traceback=remote.traceback if remote is not None else "",
        epoch=epoch,
        seq=seq,
        culprit=Culprit((note.index,)),
    )
    error = note.raised if remote is None else rebuild(remote)
    assert error is not None
    return add_note(attach_worker_context(error, context), budget_note)


def type_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"
