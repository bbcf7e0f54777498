"""The task book: what the multi-process loop knows about its tasks, and what it decides.

A pure object: it is told facts (a task was sent, a reply came, a worker
died, the time is now t) and answers with decisions (send this task to that
worker, hand out this batch, restart that worker and re-send these tasks,
give up with this error). It starts no process, reads no clock and issues
no warning, so every rule here is tested with tables of events in
microseconds (tests/unit/test_book.py).

Tasks are named by ``(epoch, seq)``; ``seq`` is the task's position in the
epoch's batch order. The rules it keeps:

* Dispatch is torch's: round-robin over the workers that are still active,
  ``prefetch`` per worker up front and one more per batch handed out; with
  ``in_order=False`` a worker at capacity is passed over.
* Exactly once: a task stays in the book from the moment it is sent until it
  is handed out; a dead worker's unanswered tasks are re-sent to its
  replacement, and a late or repeated reply is recognised as stale.
* One rule for fatal outcomes: a fatal error is placed at a position in the
  order and raised only after every earlier batch was handed out.
* Samples left out (``on_error="skip"``) are recorded when their batch is
  handed out, so the skip budget is judged in delivery order.
* A sample is called poison only once proven: tried alone in a fresh worker, it
  killed that worker too (see :meth:`TaskBook._weigh`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from .._fetch import batch_indices
from .._workers.events import Died
from .._workers.protocol import (
    BatchDone,
    IterationEnded,
    RemoteError,
    Stage,
    Task,
    TaskFailed,
    TaskReply,
)
from .._workers.remote_error import rebuild
from .._workers.status import WorkerStatus
from ..config import SupervisionPolicy
from ..errors import (
    WorkerContext,
    WorkerCrashedError,
    WorkerTimeoutError,
    add_note,
    attach_worker_context,
)
from ..records import InFlightTask, LoaderStatistics, SkippedSample, WorkerStatistics
from . import messages
from .skips import SkipLedger

STALL_FACTOR = 10  # a task is stalled past this many typical batch times...
_CRASH_TYPE = "conveyor.errors.WorkerCrashedError"
# Exit statuses a process usually gets from outside (the OOM killer under pressure
# from another process, an operator, a scheduler): weak evidence against a sample.
# A death of its own (SIGSEGV, an abort, an exit code) is strong evidence.
_OUTSIDE_EXITS = frozenset({-signal.SIGKILL, -signal.SIGTERM})
_OUTSIDE = "outside"  # the kind of death of every kill from outside (see _weigh)
# What proves that a sample (or, when no sample is named, a batch) kills its worker:
# deaths in a row that name it, all of one kind, of which some while the sample ran
# alone in a fresh worker. A death of its own (a SIGSEGV, an abort, an exit code)
# needs one such death after the one that named it; a kill from outside two.
STRONG_DEATHS, STRONG_ALONE = 2, 1
WEAK_DEATHS, WEAK_ALONE = 3, 2


# --- what the book keeps ------------------------------------------------------------


@dataclass
class LeftOutNote:
    """A sample left out of a task's batch, recorded when the batch is handed out."""

    index: Any
    worker_id: int
    stage: str
    exception_type: str
    message: str
    remote: RemoteError | None = None  # the worker's exception (None: a crash)


_ITERABLE, _BATCH, _SINGLE = range(3)  # how a task's ``index`` holds dataset indices


@dataclass(slots=True)
class Entry:
    """One task, from the moment it is sent until it is handed out."""

    seq: int
    worker_id: int
    index: Any
    shape: int  # _ITERABLE, _BATCH or _SINGLE
    sent_at: float
    exclude: tuple[Any, ...] = ()
    crashes: int = 0  # times its worker died while running it
    charged: int = 0  # restarts those deaths took from max_worker_restarts
    # The evidence (see TaskBook._weigh): the sample the last deaths named, their kind
    # ("outside" or the exit code), how many in a row, how many of them alone...
    suspect: Any = None
    suspect_kind: int | str | None = None
    named: int = 0
    alone: int = 0
    # ...or deaths in a row, of one kind, that named no sample (outside fetching).
    unnamed: int = 0
    unnamed_kind: int | str | None = None
    # The suspect is tried alone in the next fresh worker, before anything else: as a
    # task of its own (``probe_apart``, its reply only a verdict), or, when the task
    # holds no other sample, as the task itself.
    probing: bool = False
    probe_apart: bool = False
    stall_reported: bool = False
    reply: TaskReply | None = None
    origin: Any = None  # which worker process sent the reply (the pool decodes with it)
    left_out: list[LeftOutNote] = field(default_factory=list)
    cached_indices: tuple[Any, ...] | None = None
    first_sample: int = 0  # the position of its first sample in the epoch (reseed)
    want_state: bool = False  # the reply carries the dataset's state

    def samples_in_batch(self) -> int | None:
        """How many samples its batch holds, where the task itself says: a batch of a
        map-style dataset's indices with none left out. None otherwise (then only the
        batch can tell)."""
        reply = self.reply
        if self.shape != _BATCH or self.exclude or self.left_out:
            return None
        if not isinstance(reply, BatchDone) or reply.skipped:
            return None
        return len(self.index)

    @property
    def indices(self) -> tuple[Any, ...]:
        """The dataset indices of the task (empty for iterable datasets), computed
        when first asked: the hot path never needs them."""
        if self.cached_indices is None:
            batched = self.shape == _BATCH
            iterable = self.shape == _ITERABLE
            self.cached_indices = () if iterable else tuple(batch_indices(self.index, batched))
        return self.cached_indices


@dataclass
class WorkerRecord:
    active: bool = True  # an iterable dataset's worker is inactive once its iterator ends
    in_flight: int = 0  # tasks sent to it and not yet handed out
    init_crashes: int = 0  # deaths in a row before finishing start-up
    restarts: int = 0
    batches: int = 0
    samples: int = 0
    since: float = 0.0
    killed_because: str | None = None  # the book had it killed (stuck): why


# --- decisions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Handout:
    """The next task's reply, to hand to the user (decode a batch, raise its error,
    or nothing: an emptied batch or an ended iterator)."""

    entry: Entry


@dataclass(frozen=True)
class GiveUp:
    error: BaseException


@dataclass(frozen=True)
class Wait:
    """Nothing can be handed out until a worker answers."""


@dataclass(frozen=True)
class EpochEnd:
    pass


NextStep = Handout | GiveUp | Wait | EpochEnd


@dataclass(frozen=True)
class Busy:
    """A worker running a task right now, as its status page tells."""

    worker_id: int
    pid: int | None
    status: WorkerStatus


@dataclass(frozen=True)
class Restart:
    """Start a replacement for ``worker_id`` and send it ``resend``."""

    worker_id: int
    resend: tuple[Task, ...]
    report: str  # what happened, for a WorkerRestartedWarning


@dataclass(frozen=True)
class Stalled:
    worker_id: int
    seq: int
    report: str  # the warning's text, less the worker's stack (the loop adds it)


@dataclass(frozen=True)
class TimedOut:
    """Kill ``worker_id`` (stuck past ``timeout``); with ``on_timeout="restart"`` its
    death is then handled like any other, otherwise ``error`` is raised."""

    worker_id: int
    error: WorkerTimeoutError | None
    describe: str  # what it was doing, for the report


Overdue = Stalled | TimedOut


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
        timeout: float = 0,
        forked: bool = True,
        now: float = 0.0,
    ) -> None:
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.run_ahead = 0  # tasks per worker beyond prefetch (allow_run_ahead)
        self.in_order = in_order
        self.iterable = iterable
        self.auto_collation = auto_collation
        self.policy = policy
        self.timeout = timeout
        self.forked = forked  # workers started by fork (what a native crash suggests)
        self.skips = SkipLedger(skipped, policy)
        self._shape = _ITERABLE if iterable else _BATCH if auto_collation else _SINGLE
        self.workers = [WorkerRecord(since=now) for _ in range(num_workers)]
        self.restarts = 0
        self.charged = 0  # restarts counted against max_worker_restarts (see on_death)
        self.retried = 0
        self.batch_time = 0.0  # moving average of the workers' own time per task
        self.last_progress = now  # when a task was last answered (or the epoch began)
        self.epoch = -1
        self._start_epoch_state()

    def _start_epoch_state(self) -> None:
        self.tasks: dict[int, Entry] = {}  # sent, not yet handed out
        self._arrived: dict[int, None] = {}  # seqs with a reply, in order of arrival
        self.next_seq = 0
        self.next_out = 0  # in order: the seq to hand out next
        self.handed_out = 0
        self.samples_out = 0
        self._cursor = 0
        self._sampler_done = False
        self._fatal: tuple[int, BaseException] | None = None  # (place in the order, error)
        self._skipped: set[int] = set()  # positions handed out before a resume
        for record in self.workers:
            record.active = True
            record.in_flight = 0
        self._active = self.num_workers  # workers still active (iterable datasets)
        # An epoch starts with prefetch alone: after a break, the slots of the last epoch's
        # tasks still out must come back before a worker can run ahead again.
        self.run_ahead = 0

    # --- epochs ---------------------------------------------------------------------

    def start_epoch(
        self,
        epoch: int,
        epoch_samples: int | None,
        now: float = 0.0,
        *,
        first_seq: int = 0,
        first_worker: int = 0,
    ) -> None:
        """``first_seq``: a resumed epoch's first position not handed out yet;
        ``first_worker``: where round-robin dispatch resumes."""
        self.epoch = epoch
        self.last_progress = now
        self._start_epoch_state()
        self.next_seq = self.next_out = first_seq
        self._cursor = first_worker % max(1, self.num_workers)
        self.skips.start_epoch(epoch, epoch_samples)

    @property
    def fatal(self) -> BaseException | None:
        """The error the book gave up with, if it did."""
        return self._fatal[1] if self._fatal is not None else None

    def skip_seq(self) -> None:
        """The next position was handed out before the state was taken: nothing to send."""
        self._skipped.add(self.next_seq)
        self.next_seq += 1

    # --- dispatch -------------------------------------------------------------------

    def allow_run_ahead(self, per_worker: int) -> None:
        """Let each worker take up to ``per_worker`` tasks beyond ``prefetch`` (the loop
        allows it for small batches: see conveyor._transport.arena.RUN_AHEAD_BYTES)."""
        self.run_ahead = per_worker

    def wants_task(self) -> bool:
        """Whether another task goes out now: fewer than ``prefetch`` (plus the run-ahead)
        per worker are sent and not handed out, and the sampler has more."""
        if self._sampler_done or self._fatal is not None:
            return False
        return len(self.tasks) < (self.prefetch + self.run_ahead) * self.num_workers

    def next_worker(self) -> int | None:
        """The worker the next task goes to, or None if none may take one now."""
        if self._sampler_done or self._fatal is not None:
            return None
        capacity = (self.prefetch + self.run_ahead) * self.num_workers // max(1, self._active)
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
        released: tuple[int, ...] = (),
        *,
        first_sample: int = 0,
        want_state: bool = False,
        consecutive: bool = False,
    ) -> Task:
        """Record a new task for ``worker_id``; returns the message to send.
        ``consecutive``: ``index`` is a run of consecutive ints (see ``Task``)."""
        seq = self.next_seq
        self.next_seq += 1
        entry = Entry(seq, worker_id, index, self._shape, now)
        entry.first_sample, entry.want_state = first_sample, want_state
        poison = self.skips.poison()
        if poison and self._shape != _ITERABLE:
            entry.exclude = exclude = tuple(i for i in entry.indices if i in poison)
            # Left out again, without a crash: recorded again, for this epoch.
            entry.left_out += [
                LeftOutNote(
                    i,
                    worker_id,
                    "crash",
                    _CRASH_TYPE,
                    "killed its worker in an earlier epoch; left out without trying again",
                )
                for i in exclude
            ]
        self.tasks[seq] = entry
        self.workers[worker_id].in_flight += 1
        return Task(
            self.epoch,
            seq,
            index,
            released,
            exclude=entry.exclude,
            first_sample=first_sample,
            want_state=want_state,
            consecutive=consecutive,
        )

    # --- replies --------------------------------------------------------------------

    def on_ready(self, worker_id: int) -> None:
        # A replacement that starts fine ends a run of start-up deaths.
        self.workers[worker_id].init_crashes = 0

    def on_reply(
        self, worker_id: int, reply: TaskReply, origin: Any = None, now: float | None = None
    ) -> bool:
        """File a task's reply; False if it is stale (an abandoned epoch, a task
        already answered): the caller frees its payload."""
        entry = self.tasks.get(reply.seq)
        if reply.epoch != self.epoch or entry is None or entry.reply is not None:
            return False
        if entry.probing:
            entry.probing = False
            if entry.probe_apart:
                # The suspect, alone in a fresh worker, did not kill it: the evidence
                # against it is void. The task itself follows this reply.
                entry.probe_apart = False
                entry.suspect, entry.named, entry.alone = None, 0, 0
                return False
        entry.reply = reply
        entry.origin = origin
        self._arrived[reply.seq] = None
        if now is not None:
            self.last_progress = now
        if isinstance(reply, BatchDone):
            if reply.busy_s > 0:
                ewma = 0.9 * self.batch_time + 0.1 * reply.busy_s
                self.batch_time = ewma if self.batch_time else reply.busy_s
            entry.left_out += [
                LeftOutNote(
                    s.index,
                    worker_id,
                    s.stage.value,
                    f"{s.error.module}.{s.error.qualname}",
                    s.error.message,
                    s.error,
                )
                for s in reply.skipped
            ]
        return True

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
        over_budget = self._record_left_out(entry)
        if over_budget is not None:
            self._fatal = (entry.seq, over_budget)
            return GiveUp(over_budget)
        return Handout(entry)

    def peek(self) -> Entry | None:
        """The entry :meth:`next_step` would hand out next, if its reply has come;
        nothing in the book changes (the loop pins that batch ahead)."""
        if self.in_order:
            seq = self.next_out
            while seq in self._skipped:
                seq += 1
            entry = self.tasks.get(seq)
            return entry if entry is not None and entry.reply is not None else None
        first = next(iter(self._arrived), None)
        return None if first is None else self.tasks[first]

    def _ready(self) -> Entry | None:
        if self.in_order:
            while self._skipped and self.next_out in self._skipped:
                self._skipped.discard(self.next_out)
                self.next_out += 1
            entry = self.tasks.get(self.next_out)
            if entry is None or entry.reply is None:
                return None
            self.next_out += 1
            return entry
        # As they came (torch hands out in arrival order).
        seq = next(iter(self._arrived), None)
        return None if seq is None else self.tasks[seq]

    def _record_left_out(self, entry: Entry) -> BaseException | None:
        """Record the batch's left-out samples; the error to raise if that spends the budget."""
        for note in entry.left_out:
            self.skips.record(
                note.index, note.worker_id, note.stage, note.exception_type, note.message
            )
            if self.skips.over_budget():
                return self._budget_error(entry, note)
        return None

    def _budget_error(self, entry: Entry, note: LeftOutNote) -> BaseException:
        if note.remote is None:
            return WorkerCrashedError(
                f"Dataset index {note.index!r} {note.message}. {self.skips.budget_note()}",
                worker_id=note.worker_id,
                indices=(note.index,),
            )
        exc = rebuild(note.remote)
        context = WorkerContext(
            worker_id=note.worker_id,
            pid=-1,
            stage=note.stage,
            indices=(note.index,),
            traceback=note.remote.traceback,
            epoch=self.epoch,
            seq=entry.seq,
        )
        attach_worker_context(exc, context)
        return add_note(exc, self.skips.budget_note())

    def delivered(self, entry: Entry, samples: int) -> None:
        """A batch from ``entry`` reached the user (for statistics)."""
        record = self.workers[entry.worker_id]
        record.batches += 1
        record.samples += samples
        self.handed_out += 1
        self.samples_out += samples

    def task_error_context(self, entry: Entry, pid: int | None) -> WorkerContext:
        reply = entry.reply
        assert isinstance(reply, TaskFailed)
        return WorkerContext(
            worker_id=entry.worker_id,
            pid=pid or -1,
            stage=reply.stage.value,
            indices=entry.indices,
            traceback=reply.error.traceback,
            epoch=reply.epoch,
            seq=reply.seq,
        )

    # --- fatal outcomes ---------------------------------------------------------------

    def _give_up(self, error: BaseException, place: int | None = None) -> None:
        """Place a fatal error in the order (default: after every task sent so far)."""
        where = self.next_seq if place is None else place
        if self._fatal is None or where < self._fatal[0]:
            self._fatal = (where, error)

    def user_waits(self, now: float) -> None:
        """The user asked for a batch: ``timeout`` counts from here at the earliest, as
        torch's does (time spent in the training step is not the workers' fault)."""
        self.last_progress = max(self.last_progress, now)

    def on_startup_failed(self, worker_id: int, error: BaseException) -> None:
        held = self._held(worker_id)
        self._give_up(error, held[0] if held else None)

    # --- dead workers -----------------------------------------------------------------

    def _held(self, worker_id: int) -> list[int]:
        return sorted(
            seq for seq, e in self.tasks.items() if e.worker_id == worker_id and e.reply is None
        )

    def on_death(self, death: Died, now: float) -> Restart | None:
        """A worker exited unexpectedly: a Restart, or None when the book gives up
        (the fatal error is then placed in the order, see :meth:`next_step`)."""
        record = self.workers[death.worker_id]
        held = self._held(death.worker_id)
        culprit = self._culprit(death.status, held)
        named = self._named(self.tasks[culprit], death.status) if culprit is not None else None
        exit_text = record.killed_because or messages.describe_exit(death.exitcode, self.forked)
        summary = messages.death_summary(
            death,
            exit_text,
            self._indices_of,
            held,
            culprit,
            sample=named[0] if named is not None else None,
            alone=named is not None and named[1],
        )

        def give_up(note: str) -> None:
            error = self._crash_error(death, held, f"{summary} {note}".rstrip())
            self._give_up(error, min(held, default=None))

        if self._fatal is not None:
            give_up("")  # already giving up: no replacement; it matters only if earlier
            return None
        if self.iterable:
            give_up(
                "An iterable-style dataset's iterator cannot be resumed in a new process, "
                "so conveyor does not restart workers for it."
            )
            return None
        outside = death.exitcode in _OUTSIDE_EXITS and record.killed_because is None
        if death.status.stage in (Stage.STARTUP, Stage.WORKER_INIT) and not outside:
            # Killed from outside while starting says nothing about start-up itself:
            # max_worker_restarts bounds those.
            record.init_crashes += 1
            if record.init_crashes >= 2:
                give_up(
                    "It died the same way in its replacement, before any task: this is not "
                    "a passing failure."
                )
                return None
        proven = False
        if culprit is not None:
            entry = self.tasks[culprit]
            proven = self._weigh(entry, death, outside, named)
            if proven and not self._settle_poison(death, entry, exit_text, outside, give_up):
                return None
        # A death proven to be a sample's doing is charged to that sample (left out
        # and recorded, within max_errors), not to the restart budget.
        if not proven and self.charged >= self.policy.max_worker_restarts:
            give_up(
                f"The restart budget is spent (max_worker_restarts="
                f"{self.policy.max_worker_restarts}); raise it to tolerate more crashes."
            )
            return None
        self.restarts += 1
        record.restarts += 1
        if not proven:
            self.charged += 1
            if culprit is not None:
                self.tasks[culprit].charged += 1
        record.killed_because = None
        self.last_progress = now  # the replacement gets a whole timeout
        resend, probes = self._resend(held, culprit, now)
        self.retried += len(resend) - len(probes)
        if proven:
            counted = "not counted against max_worker_restarts: the sample is the cause"
        else:
            counted = f"restart {self.charged} of {self.policy.max_worker_restarts}"
        tried = (
            f", after trying dataset index {', '.join(map(repr, probes))} alone in it first "
            "(a sample that kills a fresh worker by itself is the cause; one that does not "
            "is cleared)"
            if probes
            else ""
        )
        report = (
            f"{summary} Started a replacement ({counted}) and re-sent its "
            f"{len(resend) - len(probes)} unanswered task(s){tried}; no sample is lost or "
            "repeated."
        )
        return Restart(death.worker_id, tuple(resend), report)

    def _resend(
        self, held: list[int], culprit: int | None, now: float
    ) -> tuple[list[Task], list[Any]]:
        """The tasks for a dead worker's replacement, and the samples tried alone in it.

        A suspect is tried first, before anything else the replacement runs: as a task
        of its own (same ``seq``: its reply is recognised in :meth:`on_reply`), or as
        its task when that holds no other sample. Every task that was ever running
        when its worker died is traced (its status page then names the sample)."""
        first: list[Task] = []
        rest: list[Task] = []
        probes: list[Any] = []
        for seq in held:
            entry = self.tasks[seq]
            if entry.reply is not None:
                continue  # settled by the poison handling
            entry.sent_at = now
            entry.stall_reported = False
            task = Task(
                self.epoch,
                seq,
                entry.index,
                trace=seq == culprit or entry.crashes > 0,
                exclude=entry.exclude,
                first_sample=entry.first_sample,
                want_state=entry.want_state,
            )
            if entry.probing and entry.probe_apart:
                probes.append(entry.suspect)
                first.append(self._probe(entry))
                rest.append(task)
            elif entry.probing:
                probes.append(entry.suspect)
                first.append(task)
            else:
                rest.append(task)
        rest.sort(key=lambda task: task.seq != culprit)  # what it was running, first
        return first + rest, probes

    def _probe(self, entry: Entry) -> Task:
        """The task that fetches ``entry``'s suspect alone (traced, as any retry)."""
        position = entry.indices.index(entry.suspect)
        index = [entry.suspect] if self._shape == _BATCH else entry.suspect
        return Task(
            self.epoch, entry.seq, index, trace=True, first_sample=entry.first_sample + position
        )

    def _indices_of(self, seq: int) -> tuple[Any, ...]:
        return self.tasks[seq].indices

    def _culprit(self, status: WorkerStatus, held: list[int]) -> int | None:
        """The task the worker was running when it died."""
        running = status.stage in (Stage.FETCH, Stage.COLLATE, Stage.TRANSFER)
        if running and status.epoch == self.epoch and status.seq in held:
            return status.seq
        return None

    def _named(self, entry: Entry, status: WorkerStatus) -> tuple[Any, bool] | None:
        """The sample a death of ``entry``'s worker names, and whether the sample was
        running alone in a fresh worker (None: no sample named).

        A suspect tried alone is named whatever the stage (nothing else ran there).
        Otherwise a traced retry names the sample it was fetching, and a task that
        holds a single sample names it when the worker died fetching."""
        if entry.probing:
            return entry.suspect, True
        if status.stage is not Stage.FETCH:
            return None
        if 0 <= status.position < len(entry.indices):
            return entry.indices[status.position], False
        live = self._live(entry)
        return (live[0], False) if len(live) == 1 else None

    @staticmethod
    def _live(entry: Entry) -> tuple[Any, ...]:
        """The samples the task still fetches (those not left out)."""
        return tuple(i for i in entry.indices if i not in entry.exclude)

    def _weigh(
        self, entry: Entry, death: Died, outside: bool, named: tuple[Any, bool] | None
    ) -> bool:
        """Add a death to the evidence against ``entry``; True when it proves the cause
        (``entry.suspect``, or the batch as a whole when that is None).

        Before a sample is called the cause, it is tried alone in a fresh worker: a
        worker may die at a sample for reasons that have nothing to do with it (the
        OOM killer picks a victim by size, an operator picks anyone; memory leaked by
        the samples before it). Proof is deaths in a row that name it, all of one kind,
        the last of them alone: for a death of its own one alone is enough; a kill from
        outside is weak evidence, and it takes two. Deaths that name no sample (outside
        fetching) prove the batch as a whole at STRONG_DEATHS / WEAK_DEATHS in a row,
        each in a fresh worker that ran that batch first."""
        entry.crashes += 1
        kind: int | str | None = _OUTSIDE if outside else death.exitcode
        if named is None:
            entry.suspect, entry.named, entry.alone = None, 0, 0
            same = entry.unnamed_kind == kind
            entry.unnamed, entry.unnamed_kind = (entry.unnamed + 1 if same else 1), kind
            return entry.unnamed >= (WEAK_DEATHS if outside else STRONG_DEATHS)
        sample, alone = named
        entry.unnamed, entry.unnamed_kind = 0, None
        if entry.named and sample == entry.suspect and kind == entry.suspect_kind:
            entry.named += 1
            entry.alone += alone
        else:
            entry.suspect, entry.suspect_kind = sample, kind
            entry.named, entry.alone = 1, int(alone)
        deaths, needed = (WEAK_DEATHS, WEAK_ALONE) if outside else (STRONG_DEATHS, STRONG_ALONE)
        if entry.named >= deaths and entry.alone >= needed:
            entry.probing = False
            return True
        entry.probing = True
        entry.probe_apart = len(self._live(entry)) > 1
        return False

    def _settle_poison(
        self, death: Died, entry: Entry, exit_text: str, outside: bool, give_up: Any
    ) -> bool:
        """A task was proven to kill its worker: name the sample, skip it or give up.
        Returns False when the book gave up."""
        poison = entry.suspect
        times = f"{entry.crashes} times" if entry.crashes != 2 else "twice"
        if poison is not None:
            last = "the last time" if entry.alone == 1 else f"the last {entry.alone} times"
            proof = f"{times}, {last} alone in a fresh worker"
        else:
            proof = f"{times} (the first time, and again on each retry)"
        if not self.policy.skipping:
            give_up(
                f"Dataset index {poison!r} killed its worker {proof}: that sample is the "
                "cause, not the machine. Fix the sample, or pass on_error='skip' to leave "
                "it out."
                if poison is not None
                else f"This batch killed its worker {proof}, outside fetching samples; pass "
                "on_error='skip' to leave it out."
            )
            return False
        why = f"killed its worker {times}: {exit_text}"
        lost = (poison,) if poison is not None else self._live(entry)
        # "crash": proven by its own crashes; "killed": accused by kills from outside.
        stage = "killed" if outside else "crash"
        entry.left_out += [LeftOutNote(i, death.worker_id, stage, _CRASH_TYPE, why) for i in lost]
        if not outside:
            # Proven by its own crashes: left out of later tasks too, without another.
            # Kills from outside may have come from memory pressure that passes: the
            # sample is tried again in the next epoch.
            self.skips.mark_poison(lost)
        # Its deaths were the sample's doing: given back to the restart budget.
        self.charged = max(0, self.charged - entry.charged)
        entry.charged = 0
        if poison is not None:
            entry.exclude = (*entry.exclude, poison)
            entry.crashes = entry.named = entry.alone = 0
            entry.suspect = entry.suspect_kind = None
        else:  # nothing left to retry: settle the task as an empty batch
            entry.reply = BatchDone(self.epoch, entry.seq, None)
            self._arrived[entry.seq] = None
        return True

    def _crash_error(self, death: Died, held: list[int], text: str) -> WorkerCrashedError:
        return WorkerCrashedError(
            text,
            worker_id=death.worker_id,
            pid=death.pid,
            exitcode=death.exitcode,
            indices=tuple(i for seq in held for i in self.tasks[seq].indices),
        )

    # --- time -------------------------------------------------------------------------

    def stall_threshold(self) -> float | None:
        if self.policy.stall_warning is None:
            return None
        return max(self.policy.stall_warning, STALL_FACTOR * self.batch_time)

    def _limits(self) -> list[float]:
        return [x for x in (self.timeout or None, self.stall_threshold()) if x]

    def _waited_for(self) -> Entry | None:
        """The unanswered task the loop is waiting for: in order the next one, else
        the oldest."""
        if self.in_order:
            entry = self.tasks.get(self.next_out)
            return entry if entry is not None and entry.reply is None else None
        return next((e for e in self.tasks.values() if e.reply is None), None)

    def _not_started(self, workers: list[Busy]) -> list[tuple[Busy, Entry]]:
        """Idle workers that hold an unanswered task: they have not started it."""
        found = []
        for worker in workers:
            if worker.status.stage is not None:
                continue
            held = self._held(worker.worker_id)
            if held:
                found.append((worker, self.tasks[held[0]]))
        return found

    def next_deadline(self, now: float, workers: list[Busy]) -> float | None:
        """Seconds until a limit may be reached: a task running past ``timeout`` or the
        stall threshold, a worker idle that long with a task waiting for it, or no
        batch for ``timeout`` seconds. None: no limit applies. A task that starts
        later cannot reach a limit sooner than the smallest limit, which bounds
        every answer."""
        limits = self._limits()
        if not limits:
            return None
        wakes = [min(limits)]
        for worker in workers:
            if worker.status.stage is not None:
                wakes += [limit - worker.status.age_s for limit in limits]
        threshold = self.stall_threshold()
        if threshold is not None:
            wakes += [threshold - w.status.age_s for w, _ in self._not_started(workers)]
        if self.timeout and self._waited_for() is not None:
            wakes.append(self.last_progress + self.timeout - now)
        return max(0.0, min(wakes))

    def overdue(self, now: float, workers: list[Busy]) -> list[Overdue]:
        """The timed-out worker, if any (the one running longest past ``timeout``,
        else the one holding the batch waited for when no batch came for
        ``timeout`` seconds); otherwise the tasks past the stall threshold, running
        or not started, not reported yet."""
        running = [w for w in workers if w.status.stage is not None]
        if self.timeout:
            stuck = [b for b in running if b.status.age_s >= self.timeout]
            if stuck:
                return [self._timed_out(max(stuck, key=lambda b: b.status.age_s))]
            waited = self._waited_for()
            if waited is not None and now - self.last_progress >= self.timeout:
                holder = next(w for w in workers if w.worker_id == waited.worker_id)
                return [self._timed_out(holder, waited, now - self.last_progress)]
        threshold = self.stall_threshold()
        if threshold is None:
            return []
        found: list[Overdue] = []
        for busy in running:
            status = busy.status
            entry = self.tasks.get(status.seq) if status.epoch == self.epoch else None
            if status.age_s < threshold or entry is None or entry.worker_id != busy.worker_id:
                continue
            if entry.stall_reported:
                continue
            entry.stall_reported = True
            report = messages.stall_report(busy, entry.indices, self.batch_time)
            found.append(Stalled(busy.worker_id, status.seq, report))
        for idle, entry in self._not_started(workers):
            if idle.status.age_s < threshold or entry.stall_reported:
                continue
            entry.stall_reported = True
            report = messages.not_started_report(idle, entry.seq, entry.indices, self.batch_time)
            found.append(Stalled(idle.worker_id, entry.seq, report))
        return found

    def _timed_out(self, busy: Busy, waited: Entry | None = None, quiet_s: float = 0.0) -> TimedOut:
        worker_id, status = busy.worker_id, busy.status
        if waited is not None and status.stage is None:
            entry: Entry | None = waited
            doing = messages.not_started(waited.seq, waited.indices, busy.status.age_s)
            stage = "not started"
        else:
            entry = self.tasks.get(status.seq) if status.epoch == self.epoch else None
            doing = messages.doing(status, entry is not None, entry.indices if entry else ())
            doing += f" for {status.age_s:.1f} s"
            stage = status.stage.value if status.stage is not None else "idle"
        indices = entry.indices if entry is not None else ()
        if self.policy.on_timeout == "restart":
            self.workers[
                worker_id
            ].killed_because = f"stuck ({stage}) past timeout={self.timeout}, so conveyor killed it"
            return TimedOut(worker_id, None, doing)
        error = WorkerTimeoutError(
            messages.timeout_text(self.timeout, busy, doing, stage, self.batch_time),
            worker_id=worker_id,
            pid=busy.pid,
            indices=indices,
        )
        held = self._held(worker_id)
        self._give_up(error, entry.seq if entry is not None else min(held, default=None))
        return TimedOut(worker_id, error, doing)

    def add_to_kill_reason(self, worker_id: int, stacks: str) -> None:
        reason = self.workers[worker_id].killed_because
        if reason is not None and stacks:
            self.workers[worker_id].killed_because = f"{reason}; its Python stack then:\n{stacks}"

    # --- reporting --------------------------------------------------------------------

    def statistics(self, now: float, pids: list[int | None]) -> LoaderStatistics:
        in_flight = tuple(
            InFlightTask(e.worker_id, seq, e.indices, now - e.sent_at)
            for seq, e in sorted(self.tasks.items())
            if e.reply is None
        )
        workers = tuple(
            WorkerStatistics(
                worker_id=i,
                pid=pids[i],
                batches=r.batches,
                samples=r.samples,
                restarts=r.restarts,
                samples_per_s=r.samples / max(now - r.since, 1e-9),
            )
            for i, r in enumerate(self.workers)
        )
        return LoaderStatistics(
            epoch=self.epoch,
            batches=self.handed_out,
            samples=self.samples_out,
            worker_restarts=self.restarts,
            tasks_retried=self.retried,
            samples_skipped=len(self.skips.records),
            in_flight=in_flight,
            workers=workers,
        )
