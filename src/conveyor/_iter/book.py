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

What it knows is its ledger (:mod:`.ledger`): the tasks in flight and the roster of
workers, written here alone. Dead workers are judged by :mod:`.crashes`, stalls and
timeouts by :mod:`.deadlines`; both read the ledger through its view and their verdicts
(:mod:`.facts`) come back here.
"""

from __future__ import annotations

from typing import Any

from .._task.protocol import BatchDone, IterationEnded, RoomAhead, Task, TaskReply
from .._task.supervision import SupervisionPolicy
from ..records import SkippedSample
from .facts import LeaveOut, Position, Restart
from .ledger import BATCH, ITERABLE, SINGLE, Entry, Ledger, LedgerView, WorkerRecord
from .run_ahead import RunAhead
from .skips import SkipLedger, crash_notes, notes_of
from .steps import EPOCH_END, WAIT, GiveUp, NextStep

# What on_reply says of a reply: filed; stale (the loop frees its payload); or the
# verdict of a suspect tried alone (freed too; the crash judge clears the suspect).
FILED, STALE, SURVIVED = range(3)
_FROM_THE_START = Position()


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
        now: float = 0.0,
    ) -> None:
        self.prefetch = prefetch
        self.in_order = in_order
        self.skips = SkipLedger(skipped, policy)
        self._poison = self.skips.poison  # (the same set: asked at every dispatch)
        self.shape = ITERABLE if iterable else BATCH if auto_collation else SINGLE
        self._ledger = ledger = Ledger(num_workers, in_order, now)
        self.view = LedgerView(ledger)  # what the judges, the tally and the loop read
        self._workers = ledger.workers
        self._serving = num_workers  # workers not retired (asked for at every dispatch)
        self.ahead = RunAhead(num_workers)
        self._start_epoch_state()

    def _start_epoch_state(self) -> None:
        self._ledger.new_epoch()
        self._tasks = self._ledger.tasks
        self._arrived: dict[int, None] = {}  # seqs with a reply, in order of arrival
        self.next_seq = 0
        self._cursor = 0
        self._sampler_done = False
        self._handed_out_before: frozenset[int] = frozenset()  # by an earlier run (resume)
        for record in self._workers:
            record.active = not record.retired
            record.in_flight = 0
        self._active = self.serving  # workers still active (iterable datasets)

    @property
    def epoch(self) -> int:
        return self._ledger.epoch

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    # --- epochs ---------------------------------------------------------------------

    def start_epoch(
        self, epoch: int, epoch_samples: int | None, at: Position = _FROM_THE_START
    ) -> list[Entry]:
        """Begin ``epoch`` (where ``at`` says). Returns the last epoch's tasks answered and
        never handed out (a ``break``): the loop gives their batches' memory back. Those
        still unanswered are stale: their replies are dropped as they come."""
        abandoned: list[Entry] = []
        stale = [0] * self.num_workers
        for entry in self._tasks.values():
            if entry.reply is None:
                stale[entry.worker_id] += 1
            else:
                abandoned.append(entry)
        self.ahead.start_epoch(stale)
        self._ledger.epoch = epoch
        self._start_epoch_state()
        self.next_seq = self._ledger.next_out = at.first_seq
        self._cursor = at.first_worker % max(1, self.num_workers)
        self._handed_out_before = at.handed_out_before
        self.skips.start_epoch(epoch, epoch_samples)
        return abandoned

    # --- the workers -------------------------------------------------------------------

    @property
    def serving(self) -> int:
        """Workers that get tasks (all but those retired)."""
        return self._serving

    def add_worker(self) -> int:
        """One more worker, from now on (num_workers="auto"); its id."""
        self._workers.append(WorkerRecord())
        self._serving += 1
        self._active += 1
        self.ahead.add_worker()
        return self.num_workers - 1

    def retire_worker(self, worker_id: int) -> None:
        """No more tasks for ``worker_id``: it answers those it has (see :meth:`drained`)."""
        record = self._workers[worker_id]
        if not record.retired:
            record.retired = True
            self._serving -= 1
            if record.active:
                record.active = False
                self._active -= 1

    def drained(self, worker_id: int) -> bool:
        """A retired worker whose every task was handed out: it can be stopped."""
        record = self._workers[worker_id]
        return record.retired and record.in_flight == 0

    def retired(self, worker_id: int) -> bool:
        return self._workers[worker_id].retired

    def on_ready(self, worker_id: int) -> None:
        """A worker started; a replacement that starts fine ends a run of start-up deaths."""
        record = self._workers[worker_id]
        record.ready = True
        record.start_deaths = 0

    def on_startup_failed(self, worker_id: int, error: BaseException) -> None:
        """A worker could not start: ``error`` is raised in place of its first task."""
        self._workers[worker_id].start_failed = True
        self.give_up(error, min(self.view.held(worker_id), default=None))

    def not_replaced(self, worker_id: int) -> None:
        """A worker died and has no replacement: if it never started, it never will."""
        record = self._workers[worker_id]
        if not record.ready:
            record.start_failed = True

    def killing(self, worker_id: int, why: str) -> None:
        """The loop ends ``worker_id`` as stuck, for ``why``: its death is no evidence
        against a sample, and its report says why it died."""
        self._workers[worker_id].killed_because = why

    def give_up(self, error: BaseException, place: int | None = None) -> None:
        """Place a fatal error in the order (default: after every task sent so far); the
        earliest placed is raised, once every batch before it was handed out."""
        where = self.next_seq if place is None else place
        fatal = self._ledger.fatal
        if fatal is None or where < fatal[0]:
            self._ledger.fatal = (where, error)

    # --- dispatch -------------------------------------------------------------------

    def wants_task(self) -> bool:
        """Whether another task goes out now: fewer than ``prefetch`` (plus the run-ahead)
        per worker are sent and not handed out, and the sampler has more."""
        if self._sampler_done or self._ledger.fatal is not None:
            return False
        return len(self._tasks) < (self.prefetch + self.ahead.extra) * self._serving

    def next_worker(self) -> int | None:
        """The worker the next task goes to, or None if none may take one now."""
        if self._sampler_done or self._ledger.fatal is not None:
            return None
        return self._worker_with_room()

    def worker_for_next_task(self) -> int | None:
        """The worker the next task goes to, if another task goes out now (see
        :meth:`wants_task`; the sampler may end first); else None. One call per task
        sent, as the loop tops up."""
        if self._sampler_done or self._ledger.fatal is not None:
            return None
        if len(self._tasks) >= (self.prefetch + self.ahead.extra) * self._serving:
            return None
        if self.in_order and self._active == len(self._workers):  # each in turn
            worker_id = self._cursor
            self._cursor = (worker_id + 1) % self._active
            return worker_id
        return self._worker_with_room()

    def _worker_with_room(self) -> int | None:
        capacity = (self.prefetch + self.ahead.extra) * self._serving // max(1, self._active)
        workers, count = self._workers, len(self._workers)
        for _ in range(count):
            worker_id = self._cursor
            self._cursor = (self._cursor + 1) % count
            record = workers[worker_id]
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
        entry = Entry(
            self._ledger.epoch, seq, worker_id, index, self.shape, now,
            first_sample, want_state, consecutive, places,
        )  # fmt: skip
        if self._poison and self.shape != ITERABLE:
            entry.exclude, entry.left_out = self.skips.left_out_up_front(entry.indices, worker_id)
        self._tasks[seq] = entry
        self._workers[worker_id].in_flight += 1
        return entry.task()

    # --- replies --------------------------------------------------------------------

    def on_reply(
        self,
        worker_id: int,
        reply: TaskReply,
        origin: Any = None,
        now: float | None = None,
        room: RoomAhead | None = None,
    ) -> int:
        """File a task's reply: FILED, or STALE (an abandoned epoch, a task already
        answered) or SURVIVED (a suspect's verdict): the caller frees its payload.
        ``room``: how far its worker may run ahead, as its pool tells from the batch."""
        entry = self._tasks.get(reply.seq)
        ledger = self._ledger
        if reply.epoch != ledger.epoch or entry is None or entry.reply is not None:
            self.ahead.stale_reply(worker_id)
            return STALE
        if entry.verdict_first:
            # The suspect, alone in a fresh worker, did not kill it; the task follows.
            entry.verdict_first = False
            return SURVIVED
        entry.reply = reply
        entry.origin = origin
        if not self.in_order:
            self._arrived[reply.seq] = None
        if now is not None:
            ledger.last_reply_at = now
        if type(reply) is BatchDone:
            busy_s = reply.busy_s
            if busy_s > 0:
                ewma = 0.9 * ledger.batch_time + 0.1 * busy_s
                ledger.batch_time = ewma if ledger.batch_time else busy_s
            if room is not None:
                if room.full:
                    entry.room = room  # the loop tells the user when it hands the batch out
                elif room.size != self.ahead.size:  # (decided again only when it changes)
                    self.ahead.batch(room, busy_s)
            if reply.skipped:
                entry.left_out += notes_of(worker_id, reply.skipped)
        return FILED

    def restarted(self, restart: Restart, now: float) -> list[Task]:
        """A replacement for a dead worker started (the crash judge's decision): leave out
        what it proved; the tasks to send it, in order."""
        record = self._workers[restart.worker_id]
        record.killed_because = None
        record.start_deaths += restart.start_death
        self.ahead.replaced(restart.worker_id)
        if restart.leave_out is not None:
            self._leave_out(restart.leave_out)
        sent: set[int] = set()
        tasks = []
        for resend in restart.resend:
            entry = self._tasks[resend.seq]
            if resend.seq not in sent:
                sent.add(resend.seq)
                entry.sent_at = now
                entry.sends += 1
                entry.verdict_first = resend.seq in restart.probed_apart
            tasks.append(entry.task(trace=resend.trace, alone=resend.alone))
        return tasks

    def _leave_out(self, leave: LeaveOut) -> None:
        entry = self._tasks[leave.seq]
        entry.left_out += crash_notes(leave.samples, leave.worker_id, leave.stage, leave.why)
        if leave.for_good:
            self.skips.mark_poison(leave.samples)
        if leave.whole_batch:  # nothing left to retry: settle the task as an empty batch
            entry.reply = BatchDone(self._ledger.epoch, entry.seq, None)
            if not self.in_order:
                self._arrived[entry.seq] = None
        else:
            entry.exclude = (*entry.exclude, *leave.samples)

    # --- handing out ----------------------------------------------------------------

    def next_step(self) -> NextStep:
        """What the loop does next: hand out an entry's reply (the :class:`Entry` itself),
        give up, wait, or end the epoch."""
        tasks, ledger = self._tasks, self._ledger
        if self.in_order:
            seq = ledger.next_out
            if self._handed_out_before:
                while seq in self._handed_out_before:
                    seq += 1
                ledger.next_out = seq
            entry = tasks.get(seq)
            if entry is None or entry.reply is None:
                return self._no_handout()
            ledger.next_out = seq + 1
        else:  # as they came (torch hands out in arrival order)
            seq = next(iter(self._arrived), -1)
            if seq < 0:
                return self._no_handout()
            del self._arrived[seq]
            entry = tasks[seq]
        del tasks[seq]
        record = self._workers[entry.worker_id]
        record.in_flight -= 1
        if type(entry.reply) is IterationEnded and record.active:
            record.active = False
            self._active -= 1
        if entry.left_out:
            over_budget = self.skips.record_notes(entry.left_out, entry.seq, entry.indices)
            if over_budget is not None:
                ledger.fatal = (entry.seq, over_budget)
                return GiveUp(over_budget)
        return entry

    def _no_handout(self) -> NextStep:
        """Nothing to hand out now: give up, the epoch's end, or wait."""
        fatal = self._ledger.fatal
        if fatal is not None and not any(s < fatal[0] for s in self._tasks):
            return GiveUp(fatal[1])
        if not self._tasks and fatal is None:
            return EPOCH_END
        return WAIT

    def peek(self) -> Entry | None:
        """The entry :meth:`next_step` would hand out next, if its reply has come;
        nothing in the book changes (the loop pins that batch ahead)."""
        if self.in_order:
            seq = self._ledger.next_out
            while seq in self._handed_out_before:
                seq += 1
            entry = self._tasks.get(seq)
            return entry if entry is not None and entry.reply is not None else None
        first = next(iter(self._arrived), None)
        return None if first is None else self._tasks[first]
