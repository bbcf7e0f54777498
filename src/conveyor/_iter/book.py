"""The task book: the ledger of an epoch's tasks, from dispatch to hand-out.

A pure object: told facts (a task was sent, a reply came, a worker was
replaced), it answers with decisions (send the next task to that worker, hand
out this reply, give up with this error, wait). It starts no process, reads no
clock and issues no warning: tests/unit/test_book.py tables its rules.

Tasks are named by ``(epoch, seq)``, ``seq`` being the position in the epoch's
batch order. A task is *handed out* when :meth:`TaskBook.next_step` gives its
reply to the loop (a batch, an error, or nothing). The rules:

* Dispatch is torch's: round-robin over the workers still active, ``prefetch``
  per worker up front (more for small, quick batches: :mod:`.run_ahead`) and
  one more per task handed out; with ``in_order=False`` a worker at capacity is
  passed over.
* Exactly once: a task stays in the book from the moment it is sent until it
  is handed out; a dead worker's unanswered tasks are re-sent to its
  replacement, and a late, repeated or abandoned epoch's reply is stale.
* One rule for fatal outcomes: a fatal error is placed at a position in the
  order and raised only after every earlier batch was handed out.
* Samples left out (``on_error="skip"``) are recorded when their batch is
  handed out, so the skip budget is judged in delivery order.

Dead workers are judged by :mod:`.crashes`, stalls and timeouts by
:mod:`.deadlines`; both read this ledger and their decisions come back to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._fetch import batch_indices
from .._workers.protocol import BatchDone, IterationEnded, Task, TaskReply, builder
from ..config import SupervisionPolicy
from ..records import SkippedSample
from .run_ahead import RunAhead
from .skips import LeftOutNote, SkipLedger, notes_of
from .steps import EpochEnd, GiveUp, Handout, NextStep, Position, Wait

if TYPE_CHECKING:
    from .crashes import LeaveOut, Restart

ITERABLE, BATCH, SINGLE = range(3)  # how a task's ``index`` holds dataset indices
# What on_reply says of a reply: filed; stale (the loop frees its payload); or the
# verdict of a suspect tried alone (freed too; the crash judge clears the suspect).
FILED, STALE, SURVIVED = range(3)
_FROM_THE_START = Position()
_new_task = builder(Task)  # once per batch: without the frozen __init__'s cost


# --- what the book keeps ------------------------------------------------------------


@dataclass(slots=True)
class Entry:
    """One task, from the moment it is sent until it is handed out."""

    seq: int
    worker_id: int
    index: Any
    shape: int  # ITERABLE, BATCH or SINGLE
    sent_at: float
    exclude: tuple[Any, ...] = ()
    sends: int = 1  # times sent: a dead worker's task is sent again
    # A suspect sample of the task went first, alone, as a task of the same seq: the
    # first reply is only its verdict (see conveyor._iter.crashes).
    verdict_first: bool = False
    reply: TaskReply | None = None
    origin: Any = None  # its batch as it came (a handle the loop opens or discards)
    left_out: list[LeftOutNote] = field(default_factory=list)
    cached_indices: tuple[Any, ...] | None = None
    first_sample: int = 0  # the position of its first sample in the epoch (reseed)
    want_state: bool = False  # the reply carries the dataset's state
    places: tuple[int, ...] = ()  # ranks sharding the epoch: its samples' places (reseed)

    @property
    def indices(self) -> tuple[Any, ...]:
        """The dataset indices of the task (empty for iterable datasets), computed
        when first asked: the hot path never needs them."""
        if self.cached_indices is None:
            iterable = self.shape == ITERABLE
            batched = self.shape == BATCH
            self.cached_indices = () if iterable else tuple(batch_indices(self.index, batched))
        return self.cached_indices


@dataclass
class WorkerRecord:
    active: bool = True  # an iterable dataset's worker is inactive once its iterator ends
    in_flight: int = 0  # tasks sent to it and not yet handed out
    retired: bool = False  # num_workers="auto" let it go: it gets no task again


# --- the book -----------------------------------------------------------------------


class TaskBook:
    def __init__(
        self,
        *,
        num_workers: int,
        prefetch: int,
        in_order: bool,
        iterable: bool,
        auto_collation: bool,
        policy: SupervisionPolicy,
        skipped: list[SkippedSample],
        run_ahead_bytes: int = 0,
        now: float = 0.0,
    ) -> None:
        """``run_ahead_bytes``: each worker's share of the run-ahead budget."""
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.in_order = in_order
        self.skips = SkipLedger(skipped, policy)
        self.shape = ITERABLE if iterable else BATCH if auto_collation else SINGLE
        self.workers = [WorkerRecord() for _ in range(num_workers)]
        self._serving = num_workers  # workers not retired (asked for at every dispatch)
        self.ahead = RunAhead(num_workers, prefetch, run_ahead_bytes)
        self.batch_time = 0.0  # moving average of the workers' own time per task
        self.last_reply_at = now
        self.epoch = -1
        self._start_epoch_state()

    def _start_epoch_state(self) -> None:
        self.tasks: dict[int, Entry] = {}  # sent, not yet handed out
        self._arrived: dict[int, None] = {}  # seqs with a reply, in order of arrival
        self.next_seq = 0
        self.next_out = 0  # in order: the seq to hand out next
        self._cursor = 0
        self._sampler_done = False
        self._fatal: tuple[int, BaseException] | None = None  # (place in the order, error)
        self._handed_out_before: frozenset[int] = frozenset()  # by an earlier run (resume)
        for record in self.workers:
            record.active = not record.retired
            record.in_flight = 0
        self._active = self.serving  # workers still active (iterable datasets)

    # --- epochs ---------------------------------------------------------------------

    def start_epoch(
        self, epoch: int, epoch_samples: int | None, at: Position = _FROM_THE_START
    ) -> list[Entry]:
        """Begin ``epoch`` (where ``at`` says). Returns the last epoch's tasks answered and
        never handed out (a ``break``): the loop gives their batches' memory back. Those
        still unanswered are stale: their replies are dropped as they come."""
        abandoned: list[Entry] = []
        stale = [0] * self.num_workers
        for entry in self.tasks.values():
            if entry.reply is None:
                stale[entry.worker_id] += 1
            else:
                abandoned.append(entry)
        self.ahead.start_epoch(stale)
        self.epoch = epoch
        self._start_epoch_state()
        self.next_seq = self.next_out = at.first_seq
        self._cursor = at.first_worker % max(1, self.num_workers)
        self._handed_out_before = at.handed_out_before
        self.skips.start_epoch(epoch, epoch_samples)
        return abandoned

    # --- how many workers (num_workers="auto") -----------------------------------------

    @property
    def serving(self) -> int:
        """Workers that get tasks (all but those retired)."""
        return self._serving

    def add_worker(self) -> int:
        """One more worker, from now on; its id."""
        self.workers.append(WorkerRecord())
        self.num_workers += 1
        self._serving += 1
        self._active += 1
        self.ahead.add_worker()
        return self.num_workers - 1

    def retire_worker(self, worker_id: int) -> None:
        """No more tasks for ``worker_id``: it answers those it has (see :meth:`drained`)."""
        record = self.workers[worker_id]
        if not record.retired:
            record.retired = True
            self._serving -= 1
            if record.active:
                record.active = False
                self._active -= 1

    def drained(self, worker_id: int) -> bool:
        """A retired worker whose every task was handed out: it can be stopped."""
        record = self.workers[worker_id]
        return record.retired and record.in_flight == 0

    @property
    def fatal(self) -> BaseException | None:
        """The error the book gave up with, if it did."""
        return self._fatal[1] if self._fatal is not None else None

    def give_up(self, error: BaseException, place: int | None = None) -> None:
        """Place a fatal error in the order (default: after every task sent so far); the
        earliest placed is raised, once every batch before it was handed out."""
        where = self.next_seq if place is None else place
        if self._fatal is None or where < self._fatal[0]:
            self._fatal = (where, error)

    # --- dispatch -------------------------------------------------------------------

    def wants_task(self) -> bool:
        """Whether another task goes out now: fewer than ``prefetch`` (plus the run-ahead)
        per worker are sent and not handed out, and the sampler has more."""
        if self._sampler_done or self._fatal is not None:
            return False
        return len(self.tasks) < (self.prefetch + self.ahead.extra) * self._serving

    def next_worker(self) -> int | None:
        """The worker the next task goes to, or None if none may take one now."""
        if self._sampler_done or self._fatal is not None:
            return None
        capacity = (self.prefetch + self.ahead.extra) * self._serving // max(1, self._active)
        for _ in range(self.num_workers):
            worker_id = self._cursor
            self._cursor = (self._cursor + 1) % self.num_workers
            record = self.workers[worker_id]
            # Out of order, route around a slow worker as torch does.
            if record.active and (self.in_order or record.in_flight < capacity):
                return worker_id
        return None

    def sampler_ended(self) -> None:
        self._sampler_done = True

    def add(
        self,
        worker_id: int,
        index: Any,
        now: float,
        *,
        first_sample: int = 0,
        want_state: bool = False,
        consecutive: bool = False,
        places: tuple[int, ...] = (),
    ) -> Task | None:
        """Record the sampler's next output as a task for ``worker_id``; returns the
        message to send, or None when that position was handed out before the state
        was resumed from (``in_order=False``): then the loop draws the next output.
        ``consecutive``: ``index`` is a run of consecutive ints (see ``Task``)."""
        seq = self.next_seq
        self.next_seq += 1
        if self._handed_out_before and seq in self._handed_out_before:
            return None
        entry = Entry(seq, worker_id, index, self.shape, now)
        entry.first_sample, entry.want_state, entry.places = first_sample, want_state, places
        if self.skips.has_poison and self.shape != ITERABLE:
            entry.exclude, entry.left_out = self.skips.left_out_up_front(entry.indices, worker_id)
        self.tasks[seq] = entry
        self.workers[worker_id].in_flight += 1
        return _new_task(
            epoch=self.epoch,
            seq=seq,
            index=index,
            exclude=entry.exclude,
            first_sample=first_sample,
            want_state=want_state,
            consecutive=consecutive,
            places=places,
        )

    def held(self, worker_id: int) -> list[int]:
        """The seqs of ``worker_id``'s unanswered tasks, in order."""
        return sorted(
            seq for seq, e in self.tasks.items() if e.worker_id == worker_id and e.reply is None
        )

    # --- replies --------------------------------------------------------------------

    def on_reply(
        self,
        worker_id: int,
        reply: TaskReply,
        origin: Any = None,
        now: float | None = None,
        slot_bytes: int = 0,
    ) -> int:
        """File a task's reply: FILED, or STALE (an abandoned epoch, a task already
        answered) or SURVIVED (a suspect's verdict): the caller frees its payload.
        ``slot_bytes``: the shared-memory slot its batch came in (0: none)."""
        entry = self.tasks.get(reply.seq)
        if reply.epoch != self.epoch or entry is None or entry.reply is not None:
            self.ahead.stale_reply(worker_id)
            return STALE
        if entry.verdict_first:
            # The suspect, alone in a fresh worker, did not kill it; the task follows.
            entry.verdict_first = False
            return SURVIVED
        entry.reply = reply
        entry.origin = origin
        self._arrived[reply.seq] = None
        if now is not None:
            self.last_reply_at = now
        if isinstance(reply, BatchDone):
            busy_s = reply.busy_s
            if busy_s > 0:
                ewma = 0.9 * self.batch_time + 0.1 * busy_s
                self.batch_time = ewma if self.batch_time else busy_s
            ahead = self.ahead
            if slot_bytes and slot_bytes != ahead.slot_bytes and ahead.budget:
                ahead.batch(slot_bytes, busy_s)
            if reply.skipped:
                entry.left_out += notes_of(worker_id, reply.skipped)
        return FILED

    def on_startup_failed(self, worker_id: int, error: BaseException) -> None:
        """A worker could not start: ``error`` is raised in place of its first task."""
        self.give_up(error, min(self.held(worker_id), default=None))

    def restarted(self, restart: Restart, now: float) -> None:
        """A replacement for a dead worker started and was sent ``restart.resend`` (the
        crash judge's decision): leave out what it proved."""
        self.ahead.replaced(restart.worker_id)
        if restart.leave_out is not None:
            self._leave_out(restart.leave_out)
        for seq in {task.seq for task in restart.resend}:
            entry = self.tasks[seq]
            entry.sent_at = now
            entry.sends += 1
            entry.verdict_first = seq in restart.probed_apart

    def _leave_out(self, leave: LeaveOut) -> None:
        entry = self.tasks[leave.seq]
        entry.left_out += leave.notes
        if leave.for_good:
            self.skips.mark_poison(leave.samples)
        if leave.whole_batch:  # nothing left to retry: settle the task as an empty batch
            entry.reply = BatchDone(self.epoch, entry.seq, None)
            self._arrived[entry.seq] = None
        else:
            entry.exclude = (*entry.exclude, *leave.samples)

    # --- handing out ----------------------------------------------------------------

    def next_step(self) -> NextStep:
        """What the loop does next: hand out a reply, give up, wait, or end the epoch."""
        entry = self._ready()
        if entry is None:
            if self._fatal is not None and not any(s < self._fatal[0] for s in self.tasks):
                return GiveUp(self._fatal[1])
            if not self.tasks and self._fatal is None:
                return EpochEnd()
            return Wait()
        del self.tasks[entry.seq]
        self._arrived.pop(entry.seq, None)
        record = self.workers[entry.worker_id]
        record.in_flight -= 1
        if isinstance(entry.reply, IterationEnded) and record.active:
            record.active = False
            self._active -= 1
        over_budget = (
            self.skips.record_notes(entry.left_out, entry.seq, entry.indices)
            if entry.left_out
            else None
        )
        if over_budget is not None:
            self._fatal = (entry.seq, over_budget)
            return GiveUp(over_budget)
        return Handout(entry)

    def peek(self) -> Entry | None:
        """The entry :meth:`next_step` would hand out next, if its reply has come;
        nothing in the book changes (the loop pins that batch ahead)."""
        if self.in_order:
            seq = self.next_out
            while seq in self._handed_out_before:
                seq += 1
            entry = self.tasks.get(seq)
            return entry if entry is not None and entry.reply is not None else None
        first = next(iter(self._arrived), None)
        return None if first is None else self.tasks[first]

    def waited_for(self) -> Entry | None:
        """The unanswered task the loop waits for: in order the next one, else the oldest."""
        if self.in_order:
            entry = self.tasks.get(self.next_out)
            return entry if entry is not None and entry.reply is None else None
        return next((e for e in self.tasks.values() if e.reply is None), None)

    def _ready(self) -> Entry | None:
        if self.in_order:
            while self._handed_out_before and self.next_out in self._handed_out_before:
                self.next_out += 1
            entry = self.tasks.get(self.next_out)
            if entry is None or entry.reply is None:
                return None
            self.next_out += 1
            return entry
        # As they came (torch hands out in arrival order).
        seq = next(iter(self._arrived), None)
        return None if seq is None else self.tasks[seq]
