"""Crash forensics: who died holding what, and what is proven poison.

A pure object beside the task book, whose ledger it reads: it is told that a
worker died (and, when the loop killed one, why) and answers with a decision —
start a replacement and re-send these tasks, or give up with this error at
this place in the order. It starts no process, reads no clock and issues no
warning; tests/unit/test_crashes.py tables its rules.

Prove it before calling a sample poison: a worker can die at a sample for
reasons that are not the sample's (the OOM killer picks a victim by size, an
operator picks anyone, the samples before it leaked memory). So the sample a
death names is tried *alone in a fresh worker* before anything else runs there,
and the evidence is weighed by :meth:`CrashJudge._weigh`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from .._workers.events import Died
from .._workers.protocol import Stage, Task
from .._workers.status import WorkerStatus
from ..config import SupervisionPolicy
from ..errors import WorkerCrashedError
from . import messages
from .book import BATCH, Entry, TaskBook
from .skips import LeftOutNote, crash_notes

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


@dataclass(frozen=True)
class LeaveOut:
    """Samples of task ``seq`` proven to kill workers, left out under ``on_error="skip"``:
    out of its batch (``whole_batch``: the batch is settled empty), recorded with
    ``notes``, and out of every later task when ``for_good``."""

    seq: int
    samples: tuple[Any, ...]
    notes: tuple[LeftOutNote, ...]
    whole_batch: bool
    for_good: bool


@dataclass
class Evidence:
    """What the deaths of its workers say against one task (see CrashJudge._weigh)."""

    crashes: int = 0  # times its worker died while running it
    charged: int = 0  # restarts those deaths took from max_worker_restarts
    # The sample the last deaths named, their kind ("outside" or the exit code), how
    # many in a row, how many of them alone...
    suspect: Any = None
    suspect_kind: int | str | None = None
    named: int = 0
    alone: int = 0
    # ...or deaths in a row, of one kind, that named no sample (outside fetching).
    unnamed: int = 0
    unnamed_kind: int | str | None = None
    # The suspect is tried alone in the next fresh worker, before anything else: as a
    # task of its own (``apart``, its reply only a verdict), or, when the task holds
    # no other sample, as the task itself.
    probing: bool = False
    apart: bool = False

    def clear_suspect(self) -> None:
        self.suspect, self.suspect_kind, self.named, self.alone = None, None, 0, 0


@dataclass(frozen=True)
class Restart:
    """Start a replacement for ``worker_id`` and send it ``resend``."""

    worker_id: int
    resend: tuple[Task, ...]
    report: str  # what happened, for a WorkerRestartedWarning
    retried: int = 0  # the dead worker's tasks re-sent (a suspect tried alone not counted)
    probed_apart: frozenset[int] = frozenset()  # seqs whose first reply is a verdict
    leave_out: LeaveOut | None = None  # samples proven to kill workers (on_error="skip")


@dataclass(frozen=True)
class GiveUpAt:
    """Start no replacement: raise ``error`` at ``place`` in the order (see
    TaskBook.give_up)."""

    error: WorkerCrashedError
    place: int | None


Verdict = Restart | GiveUpAt


class CrashJudge:
    def __init__(
        self, book: TaskBook, policy: SupervisionPolicy, *, iterable: bool, forked: bool = True
    ) -> None:
        """``forked``: workers start by fork (what a native crash then suggests)."""
        self._book = book
        self.policy = policy
        self.iterable = iterable
        self.forked = forked
        self.charged = 0  # restarts counted against max_worker_restarts (see on_death)
        self._evidence: dict[int, Evidence] = {}  # by seq, in the epoch below
        self._epoch = book.epoch
        self._init_crashes = [0] * book.num_workers  # deaths in a row before start-up ended
        self._killed_because: dict[int, str] = {}  # workers the loop killed: why

    # --- what the judge is told -------------------------------------------------------

    def add_worker(self) -> None:
        self._init_crashes.append(0)

    def on_ready(self, worker_id: int) -> None:
        """A replacement that starts fine ends a run of start-up deaths."""
        self._init_crashes[worker_id] = 0

    def killing(self, worker_id: int, reason: str, stacks: str = "") -> None:
        """The loop kills ``worker_id`` (stuck) for ``reason``: its death is no evidence
        against a sample, and the report says why it died."""
        self._killed_because[worker_id] = messages.kill_reason(reason, stacks)

    def survived(self, seq: int) -> None:
        """The suspect of task ``seq``, alone in a fresh worker, did not kill it: the
        evidence against it is void (the book saw the verdict, see TaskBook.on_reply)."""
        self._sync_epoch()
        evidence = self._evidence_of(seq)
        evidence.probing = evidence.apart = False
        evidence.clear_suspect()

    # --- a death ------------------------------------------------------------------------

    def on_death(self, death: Died) -> Verdict:
        """A worker exited unexpectedly: restart it (re-sending what it held, a suspect
        first), or give up."""
        book, worker_id = self._book, death.worker_id
        self._sync_epoch()
        held = book.held(worker_id)
        if death.bystander is not None:
            return self._bystander(death, held)
        culprit = self._culprit(death.status, held)
        entry = book.tasks[culprit] if culprit is not None else None
        evidence = self._evidence_of(culprit) if culprit is not None else None
        named = None
        if entry is not None and evidence is not None:
            named = self._named(entry, evidence, death.status)
        reason = self._killed_because.get(worker_id)
        exit_text = reason or death.cause or messages.describe_exit(death.exitcode, self.forked)
        summary = messages.death_summary(
            death,
            exit_text,
            lambda seq: book.tasks[seq].indices,
            held,
            culprit,
            sample=named[0] if named is not None else None,
            alone=named is not None and named[1],
        )

        def give_up(note: str) -> GiveUpAt:
            indices = tuple(i for seq in held for i in book.tasks[seq].indices)
            error = WorkerCrashedError(
                f"{summary} {note}".rstrip(),
                worker_id=worker_id,
                pid=death.pid,
                exitcode=death.exitcode,
                indices=indices,
            )
            return GiveUpAt(error, min(held, default=None))

        if book.fatal is not None:
            return give_up("")  # already giving up: no replacement; it matters only if earlier
        if self.iterable:
            return give_up(messages.NO_RESTART_ITERABLE)
        # An unknown end (exitcode None: a Ray actor's) may have come from outside too.
        unknown = death.exitcode is None
        outside = (unknown or death.exitcode in _OUTSIDE_EXITS) and reason is None
        starting = death.status.stage in (Stage.STARTUP, Stage.WORKER_INIT)
        if starting and not outside and death.charged:
            # Killed from outside while starting says nothing about start-up itself:
            # max_worker_restarts bounds those.
            self._init_crashes[worker_id] += 1
            if self._init_crashes[worker_id] >= 2:
                return give_up(messages.SAME_DEATH_AT_START)
        proven, leave_out = False, None
        if entry is not None and evidence is not None:
            proven = self._weigh(evidence, entry, death, outside, named)
            if proven and not self.policy.skipping:
                return give_up(
                    messages.poison_proof(evidence.suspect, evidence.crashes, evidence.alone)
                )
            if proven:
                leave_out = self._leave_out(entry, evidence, death, exit_text, outside)
        # A death proven to be a sample's doing is charged to that sample (left out
        # and recorded, within max_errors), not to the restart budget.
        limit = self.policy.max_worker_restarts
        if not proven and death.charged and self.charged >= limit:
            return give_up(messages.restart_budget_spent(limit))
        if not proven and death.charged:
            self.charged += 1
            if evidence is not None:
                evidence.charged += 1
        self._killed_because.pop(worker_id, None)
        resend, probes, apart = self._resend(held, culprit, leave_out)
        retried = len(resend) - len(probes)
        report = messages.restart_report(summary, proven, self.charged, limit, retried, probes)
        if death.charged:  # once for the process
            report += messages.restarted_with(death.shared_with)
        return Restart(worker_id, tuple(resend), report, retried, frozenset(apart), leave_out)

    def _bystander(self, death: Died, held: list[int]) -> Verdict:
        """A core whose process died of a sibling core's doing: nothing against what it
        ran; restarted with its process, its tasks sent again as they were. The
        sibling's report says so (no warning of its own)."""
        if self._book.fatal is not None or self.iterable:
            return GiveUpAt(self._bystander_error(death, held), min(held, default=None))
        resend, _, _ = self._resend(held, None, None)
        return Restart(death.worker_id, tuple(resend), "", len(resend))

    def _bystander_error(self, death: Died, held: list[int]) -> WorkerCrashedError:
        indices = tuple(i for seq in held for i in self._book.tasks[seq].indices)
        return WorkerCrashedError(
            messages.bystander_death(death, indices),
            worker_id=death.worker_id,
            pid=death.pid,
            exitcode=death.exitcode,
            indices=indices,
        )

    # --- the rules ----------------------------------------------------------------------

    def _sync_epoch(self) -> None:
        if self._epoch != self._book.epoch:  # a new epoch: seqs name other tasks
            self._evidence.clear()
            self._epoch = self._book.epoch

    def _evidence_of(self, seq: int) -> Evidence:
        evidence = self._evidence.get(seq)
        if evidence is None:
            evidence = self._evidence[seq] = Evidence()
        return evidence

    def _culprit(self, status: WorkerStatus, held: list[int]) -> int | None:
        """The task the worker was running when it died."""
        running = status.stage in (Stage.FETCH, Stage.COLLATE, Stage.TRANSFER)
        if running and status.epoch == self._book.epoch and status.seq in held:
            return status.seq
        return None

    @staticmethod
    def _named(entry: Entry, evidence: Evidence, status: WorkerStatus) -> tuple[Any, bool] | None:
        """The sample a death of ``entry``'s worker names, and whether the sample was
        running alone in a fresh worker (None: no sample named).

        A suspect tried alone is named whatever the stage (nothing else ran there).
        Otherwise a traced retry names the sample it was fetching, and a task that
        holds a single sample names it when the worker died fetching."""
        if evidence.probing:
            return evidence.suspect, True
        if status.stage is not Stage.FETCH:
            return None
        if 0 <= status.position < len(entry.indices):
            return entry.indices[status.position], False
        live = _live(entry)
        return (live[0], False) if len(live) == 1 else None

    @staticmethod
    def _weigh(
        evidence: Evidence, entry: Entry, death: Died, outside: bool, named: tuple[Any, bool] | None
    ) -> bool:
        """Add a death to the evidence against ``entry``; True when it proves the cause
        (``evidence.suspect``, or the batch as a whole when that is None).

        Proof is deaths in a row that name the sample, all of one kind, the last of
        them alone: for a death of its own one alone is enough; a kill from outside is
        weak evidence, and it takes two. Deaths that name no sample (outside fetching)
        prove the batch as a whole at STRONG_DEATHS / WEAK_DEATHS in a row, each in a
        fresh worker that ran that batch first. A suspect that survives alone is
        cleared (:meth:`survived`) and the evidence starts again."""
        ev = evidence
        ev.crashes += 1
        kind: int | str | None = _OUTSIDE if outside else death.exitcode
        if named is None:
            ev.clear_suspect()
            same = ev.unnamed_kind == kind
            ev.unnamed, ev.unnamed_kind = (ev.unnamed + 1 if same else 1), kind
            return ev.unnamed >= (WEAK_DEATHS if outside else STRONG_DEATHS)
        sample, alone = named
        ev.unnamed, ev.unnamed_kind = 0, None
        if ev.named and sample == ev.suspect and kind == ev.suspect_kind:
            ev.named += 1
            ev.alone += alone
        else:
            ev.suspect, ev.suspect_kind = sample, kind
            ev.named, ev.alone = 1, int(alone)
        deaths, needed = (WEAK_DEATHS, WEAK_ALONE) if outside else (STRONG_DEATHS, STRONG_ALONE)
        if ev.named >= deaths and ev.alone >= needed:
            ev.probing = False
            return True
        ev.probing = True
        ev.apart = len(_live(entry)) > 1
        return False

    def _leave_out(
        self, entry: Entry, evidence: Evidence, death: Died, exit_text: str, outside: bool
    ) -> LeaveOut:
        """A task was proven to kill its worker, under on_error="skip": what to leave out.
        Its deaths were the sample's doing: given back to the restart budget."""
        poison = evidence.suspect
        why = messages.left_out_for_crashes(evidence.crashes, exit_text)
        lost = (poison,) if poison is not None else _live(entry)
        # "crash": proven by its own crashes; "killed": accused by kills from outside.
        stage = "killed" if outside else "crash"
        notes = tuple(crash_notes(lost, death.worker_id, stage, why))
        self.charged = max(0, self.charged - evidence.charged)
        evidence.charged = 0
        if poison is not None:
            evidence.crashes = 0
            evidence.clear_suspect()
        # Proven by its own crashes: left out of later tasks too, without another. Kills
        # from outside may have come from memory pressure that passes: the sample is
        # tried again in the next epoch.
        return LeaveOut(entry.seq, lost, notes, whole_batch=poison is None, for_good=not outside)

    def _resend(
        self, held: list[int], culprit: int | None, leave_out: LeaveOut | None
    ) -> tuple[list[Task], list[Any], list[int]]:
        """The tasks for a dead worker's replacement, the samples tried alone in it, and
        the seqs whose suspect goes first as a task of its own.

        A suspect is tried first, before anything else the replacement runs: as a task
        of its own (same ``seq``: its reply is recognised by the book), or as its task
        when that holds no other sample. Every task that was ever running when its
        worker died is traced (its status page then names the sample)."""
        book = self._book
        first: list[Task] = []
        rest: list[Task] = []
        probes: list[Any] = []
        apart: list[int] = []
        for seq in held:
            entry = book.tasks[seq]
            exclude = entry.exclude
            if leave_out is not None and leave_out.seq == seq:
                if leave_out.whole_batch:
                    continue  # settled as an empty batch
                exclude = (*exclude, *leave_out.samples)
            evidence = self._evidence.get(seq)
            task = Task(
                book.epoch,
                seq,
                entry.index,
                trace=seq == culprit or (evidence is not None and evidence.crashes > 0),
                exclude=exclude,
                first_sample=entry.first_sample,
                want_state=entry.want_state,
                places=entry.places,
            )
            if evidence is None or not evidence.probing:
                rest.append(task)
                continue
            probes.append(evidence.suspect)
            if evidence.apart:
                apart.append(seq)
                first.append(self._probe(entry, evidence.suspect))
                rest.append(task)
            else:
                first.append(task)
        rest.sort(key=lambda task: task.seq != culprit)  # what it was running, first
        return first + rest, probes, apart

    def _probe(self, entry: Entry, suspect: Any) -> Task:
        """The task that fetches ``entry``'s suspect alone (traced, as any retry)."""
        position = entry.indices.index(suspect)
        index = [suspect] if entry.shape == BATCH else suspect
        return Task(
            self._book.epoch,
            entry.seq,
            index,
            trace=True,
            first_sample=entry.first_sample + position,
            places=entry.places[position : position + 1],
        )


def _live(entry: Entry) -> tuple[Any, ...]:
    """The samples the task still fetches (those not left out)."""
    return tuple(i for i in entry.indices if i not in entry.exclude)
