"""The ledger: an epoch's tasks in flight and the roster of workers.

The task book alone writes it, as tasks are sent, answered and handed out and as
workers start, die and are replaced. The crash judge, the deadlines, the tally and
the loop read it through a :class:`LedgerView`, whose records are typed read-only
(:class:`TaskRecord`, :class:`WorkerRecordView`): what they conclude comes back to the
book as facts (:mod:`.facts`). A task becomes a message in one place,
:meth:`Entry.task`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

from .._task.fetch import batch_indices
from .._task.protocol import RoomAhead, Task, TaskReply, builder

if TYPE_CHECKING:
    from .skips import LeftOutNote

__all__ = [
    "BATCH",
    "ITERABLE",
    "SINGLE",
    "Entry",
    "Ledger",
    "LedgerView",
    "TaskRecord",
    "WorkerRecord",
    "WorkerRecordView",
]

ITERABLE, BATCH, SINGLE = range(3)  # how a task's ``index`` holds dataset indices
_new_task = builder(Task)
_new = object.__new__
_TASK_DEFAULTS = {f.name: f.default for f in fields(Task) if f.default is not MISSING}


@dataclass(slots=True)
class Entry:
    """One task, from the moment it is sent until it is handed out."""

    epoch: int
    seq: int
    worker_id: int
    index: Any
    shape: int  # ITERABLE, BATCH or SINGLE
    sent_at: float
    first_sample: int = 0  # the position of its first sample in the epoch (reseed)
    want_state: bool = False  # the reply carries the dataset's state
    consecutive: bool = False  # ``index`` is a run of consecutive ints (see Task)
    places: tuple[int, ...] = ()  # ranks sharding the epoch: its samples' places (reseed)
    exclude: tuple[Any, ...] = ()
    sends: int = 1  # times sent: a dead worker's task is sent again
    # A suspect sample of the task went first, alone, as a task of the same seq: the
    # first reply is only its verdict (see conveyor._iter.crashes).
    verdict_first: bool = False
    reply: TaskReply | None = None
    origin: Any = None  # its batch as it came (a handle the loop opens or discards)
    # It came another way, its worker's memory all in use: who holds it (see RunAhead).
    room: RoomAhead | None = None
    left_out: list[LeftOutNote] = field(default_factory=list)
    cached_indices: tuple[Any, ...] | None = None

    @property
    def indices(self) -> tuple[Any, ...]:
        """The dataset indices of the task (empty for iterable datasets), computed
        when first asked: the hot path never needs them."""
        if self.cached_indices is None:
            iterable = self.shape == ITERABLE
            batched = self.shape == BATCH
            self.cached_indices = () if iterable else tuple(batch_indices(self.index, batched))
        return self.cached_indices

    def live(self) -> tuple[Any, ...]:
        """The samples the task still fetches (those not left out)."""
        return tuple(i for i in self.indices if i not in self.exclude)

    def task(self, *, trace: bool = False, alone: tuple[Any, ...] = ()) -> Task:
        """The message that asks a worker for this task, as it stands (what is left out
        excluded; ``trace``: the worker's status page names each sample it fetches); or,
        given ``alone`` (one of its samples), that sample alone, traced, as a task of the
        same seq. The only place a Task is made."""
        if alone:
            (sample,) = alone
            position = self.indices.index(sample)
            return _new_task(
                epoch=self.epoch,
                seq=self.seq,
                index=[sample] if self.shape == BATCH else sample,
                trace=True,
                first_sample=self.first_sample + position,
                places=self.places[position : position + 1],
            )
        task = _new(Task)  # once a batch: without the frozen __init__'s cost
        task.__dict__.update(
            _TASK_DEFAULTS,  # (a field added to Task later has its default)
            epoch=self.epoch,
            seq=self.seq,
            index=self.index,
            trace=trace,
            exclude=self.exclude,
            first_sample=self.first_sample,
            want_state=self.want_state,
            consecutive=self.consecutive,
            places=self.places,
        )
        return task


@dataclass(slots=True)
class WorkerRecord:
    """One worker of the roster (its id is its place), over the iterator's life."""

    active: bool = True  # an iterable dataset's worker is inactive once its iterator ends
    in_flight: int = 0  # tasks sent to it and not yet handed out
    retired: bool = False  # num_workers="auto" let it go: it gets no task again
    ready: bool = False  # it said it started (the iterator waits for every worker)
    start_failed: bool = False  # it never will: its start-up failed, or it died unreplaced
    start_deaths: int = 0  # deaths of its own in a row before start-up ended
    killed_because: str | None = None  # the loop ended it as stuck: why, for its death


class TaskRecord(Protocol):
    """A task as the ledger's readers see it."""

    @property
    def seq(self) -> int: ...
    @property
    def worker_id(self) -> int: ...
    @property
    def shape(self) -> int: ...
    @property
    def sent_at(self) -> float: ...
    @property
    def sends(self) -> int: ...
    @property
    def exclude(self) -> tuple[Any, ...]: ...
    @property
    def reply(self) -> TaskReply | None: ...
    @property
    def origin(self) -> Any: ...
    @property
    def indices(self) -> tuple[Any, ...]: ...
    def live(self) -> tuple[Any, ...]: ...


class WorkerRecordView(Protocol):
    """A worker of the roster as the ledger's readers see it."""

    @property
    def ready(self) -> bool: ...
    @property
    def start_failed(self) -> bool: ...
    @property
    def start_deaths(self) -> int: ...
    @property
    def killed_because(self) -> str | None: ...


class Ledger:
    """What the book knows (see the module docstring). Written by the book alone."""

    def __init__(self, num_workers: int, in_order: bool, now: float) -> None:
        self.in_order = in_order
        self.epoch = -1
        self.workers = [WorkerRecord() for _ in range(num_workers)]
        self.batch_time = 0.0  # moving average of the workers' own time per task
        self.last_reply_at = now
        self.new_epoch()

    def new_epoch(self) -> None:
        self.tasks: dict[int, Entry] = {}  # sent, not yet handed out
        self.next_out = 0  # in order: the seq to hand out next
        self.fatal: tuple[int, BaseException] | None = None  # (place in the order, error)


class LedgerView:
    """The ledger, read (see the module docstring)."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    @property
    def epoch(self) -> int:
        return self._ledger.epoch

    @property
    def num_workers(self) -> int:
        return len(self._ledger.workers)

    @property
    def batch_time(self) -> float:
        """The workers' own time per task, a moving average (0: none known yet)."""
        return self._ledger.batch_time

    @property
    def last_reply_at(self) -> float:
        return self._ledger.last_reply_at

    @property
    def fatal(self) -> BaseException | None:
        """The error the book gave up with, if it did."""
        fatal = self._ledger.fatal
        return fatal[1] if fatal is not None else None

    def entry(self, seq: int) -> TaskRecord | None:
        """Task ``seq`` of this epoch, if it is in flight."""
        return self._ledger.tasks.get(seq)

    def entries(self) -> Iterable[TaskRecord]:
        """Every task in flight."""
        return self._ledger.tasks.values()

    def held(self, worker_id: int) -> list[int]:
        """The seqs of ``worker_id``'s unanswered tasks, in order."""
        return sorted(
            seq
            for seq, e in self._ledger.tasks.items()
            if e.worker_id == worker_id and e.reply is None
        )

    def waited_for(self) -> TaskRecord | None:
        """The unanswered task the loop waits for: in order the next one, else the oldest."""
        ledger = self._ledger
        if ledger.in_order:
            entry = ledger.tasks.get(ledger.next_out)
            return entry if entry is not None and entry.reply is None else None
        return next((e for e in ledger.tasks.values() if e.reply is None), None)

    def worker(self, worker_id: int) -> WorkerRecordView:
        return self._ledger.workers[worker_id]

    def starting(self) -> bool:
        """Some worker has not said it started, and none failed to."""
        workers = self._ledger.workers
        return any(not w.ready for w in workers) and not any(w.start_failed for w in workers)

    def start_failed(self) -> bool:
        """Some worker will never start."""
        return any(w.start_failed for w in self._ledger.workers)
