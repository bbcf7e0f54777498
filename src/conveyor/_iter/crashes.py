"""Crash forensics: who died holding what, and what is proven poison.

A pure object beside the task book, whose ledger it reads through its view: it is
told that a worker died and answers with a verdict (:mod:`.facts`) — start a
replacement and re-send these tasks, or give up with this error at this place in the
order — which the book applies. Why the loop killed a worker, and how many times one
died starting, are in the ledger's roster. It starts no process, reads no clock and
issues no warning; tests/unit/test_crashes.py tables its rules.

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

from .._task.protocol import Bystander, Died, Stage, WorkerStatus
from .._task.supervision import SupervisionPolicy
from ..errors import WorkerCrashedError
from . import messages
from .facts import GiveUpAt, LeaveOut, Resend, Restart, Verdict
from .ledger import LedgerView, TaskRecord

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
class _Case:
    """What the judge makes of one death before deciding (see CrashJudge._case)."""

    held: list[int]  # the seqs of the worker's unanswered tasks
    culprit: int | None  # the one it was running
    entry: TaskRecord | None
    evidence: Evidence | None
    named: tuple[Any, bool] | None  # the sample the death names, and whether alone
    exit_text: str
    summary: str
    outside: bool  # the kind of death a kill from outside is
    starting: bool  # it died starting up


class CrashJudge:
    def __init__(
        self, ledger: LedgerView, policy: SupervisionPolicy, *, iterable: bool, forked: bool = True
    ) -> None:
        """``forked``: workers start by fork (what a native crash then suggests)."""
        self._ledger = ledger
        self.policy = policy
        self.iterable = iterable
        self.forked = forked
        self.charged = 0  # restarts counted against max_worker_restarts (see on_death)
        self._evidence: dict[int, Evidence] = {}  # by seq, in the epoch below
        self._epoch = ledger.epoch

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
        self._sync_epoch()
        held = self._ledger.held(death.worker_id)
        if isinstance(death.blame, Bystander):
            return self._bystander(death, death.blame, held)
        case = self._case(death, held)
        if self._ledger.fatal is not None:
            return self._give_up(death, case, "")  # no replacement; it matters if earlier
        if self.iterable:
            return self._give_up(death, case, messages.NO_RESTART_ITERABLE)
        # Killed from outside while starting says nothing about start-up itself:
        # max_worker_restarts bounds those.
        start_death = case.starting and not case.outside and death.charged
        if start_death and self._ledger.worker(death.worker_id).start_deaths + 1 >= 2:
            return self._give_up(death, case, messages.SAME_DEATH_AT_START)
        proven, leave_out = False, None
        entry, evidence = case.entry, case.evidence
        if entry is not None and evidence is not None:
            proven = self._weigh(evidence, entry, death, case.outside, case.named)
            if proven and not self.policy.skipping:
                proof = messages.poison_proof(evidence.suspect, evidence.crashes, evidence.alone)
                return self._give_up(death, case, proof)
            if proven:
                leave_out = self._leave_out(entry, evidence, death, case.exit_text, case.outside)
        return self._restart(death, case, proven, leave_out, start_death)

    def _case(self, death: Died, held: list[int]) -> _Case:
        """What the ledger and the evidence say of a death: the task it was running, the
        sample it names, how it ended, in words."""
        culprit = self._culprit(death.status, held)
        entry = self._entry(culprit) if culprit is not None else None
        evidence = self._evidence_of(culprit) if culprit is not None else None
        named = None
        if entry is not None and evidence is not None:
            named = self._named(entry, evidence, death.status)
        reason = self._ledger.worker(death.worker_id).killed_because
        exit_text = reason or death.cause or messages.describe_exit(death.exitcode, self.forked)
        summary = messages.death_summary(
            death,
            exit_text,
            lambda seq: self._entry(seq).indices,
            held,
            culprit,
            sample=named[0] if named is not None else None,
            alone=named is not None and named[1],
        )
        # An unknown end (exitcode None: a Ray actor's) may have come from outside too.
        unknown = death.exitcode is None
        outside = (unknown or death.exitcode in _OUTSIDE_EXITS) and reason is None
        starting = death.status.stage in (Stage.STARTUP, Stage.WORKER_INIT)
        return _Case(held, culprit, entry, evidence, named, exit_text, summary, outside, starting)

    def _give_up(self, death: Died, case: _Case, note: str) -> GiveUpAt:
        error = WorkerCrashedError(
            f"{case.summary} {note}".rstrip(),
            worker_id=death.worker_id,
            pid=death.pid,
            exitcode=death.exitcode,
            indices=self._indices(case.held),
        )
        return GiveUpAt(error, min(case.held, default=None))

    def _restart(
        self,
        death: Died,
        case: _Case,
        proven: bool,
        leave_out: LeaveOut | None,
        start_death: bool,
    ) -> Verdict:
        """A replacement, charged to the restart budget unless the death was proven to
        be a sample's doing (left out and recorded, within max_errors); or, the budget
        spent, giving up."""
        limit = self.policy.max_worker_restarts
        if not proven and death.charged and self.charged >= limit:
            return self._give_up(death, case, messages.restart_budget_spent(limit))
        if not proven and death.charged:
            self.charged += 1
            if case.evidence is not None:
                case.evidence.charged += 1
        resend, probes = self._resend(case.held, case.culprit, leave_out)
        retried = len(resend) - len(probes)
        report = messages.restart_report(case.summary, proven, self.charged, limit, retried, probes)
        if death.charged:  # once for the process
            report += messages.restarted_with(death.siblings)
        return Restart(death.worker_id, resend, report, retried, leave_out, start_death)

    def _bystander(self, death: Died, blame: Bystander, held: list[int]) -> Verdict:
        """A core whose process died of a sibling core's doing: nothing against what it
        ran; restarted with its process, its tasks sent again as they were. The
        sibling's report says so (no warning of its own)."""
        if self._ledger.fatal is not None or self.iterable:
            error = self._bystander_error(death, blame, held)
            return GiveUpAt(error, min(held, default=None))
        resend, _ = self._resend(held, None, None)
        return Restart(death.worker_id, resend, "", len(resend))

    def _bystander_error(
        self, death: Died, blame: Bystander, held: list[int]
    ) -> WorkerCrashedError:
        indices = self._indices(held)
        return WorkerCrashedError(
            messages.bystander_death(death, blame.of, indices),
            worker_id=death.worker_id,
            pid=death.pid,
            exitcode=death.exitcode,
            indices=indices,
        )

    # --- the rules ----------------------------------------------------------------------

    def _entry(self, seq: int) -> TaskRecord:
        entry = self._ledger.entry(seq)
        assert entry is not None, "a task the dead worker held is in flight"
        return entry

    def _indices(self, held: list[int]) -> tuple[Any, ...]:
        return tuple(i for seq in held for i in self._entry(seq).indices)

    def _sync_epoch(self) -> None:
        if self._epoch != self._ledger.epoch:  # a new epoch: seqs name other tasks
            self._evidence.clear()
            self._epoch = self._ledger.epoch

    def _evidence_of(self, seq: int) -> Evidence:
        evidence = self._evidence.get(seq)
        if evidence is None:
            evidence = self._evidence[seq] = Evidence()
        return evidence

    def _culprit(self, status: WorkerStatus, held: list[int]) -> int | None:
        """The task the worker was running when it died."""
        running = status.stage in (Stage.FETCH, Stage.COLLATE, Stage.TRANSFER)
        if running and status.epoch == self._ledger.epoch and status.seq in held:
            return status.seq
        return None

    @staticmethod
    def _named(
        entry: TaskRecord, evidence: Evidence, status: WorkerStatus
    ) -> tuple[Any, bool] | None:
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
        live = entry.live()
        return (live[0], False) if len(live) == 1 else None

    @staticmethod
    def _weigh(
        evidence: Evidence,
        entry: TaskRecord,
        death: Died,
        outside: bool,
        named: tuple[Any, bool] | None,
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
        ev.apart = len(entry.live()) > 1
        return False

    def _leave_out(
        self, entry: TaskRecord, evidence: Evidence, death: Died, exit_text: str, outside: bool
    ) -> LeaveOut:
        """A task was proven to kill its worker, under on_error="skip": what to leave out.
        Its deaths were the sample's doing: given back to the restart budget."""
        poison = evidence.suspect
        why = messages.left_out_for_crashes(evidence.crashes, exit_text)
        lost = (poison,) if poison is not None else entry.live()
        self.charged = max(0, self.charged - evidence.charged)
        evidence.charged = 0
        if poison is not None:
            evidence.crashes = 0
            evidence.clear_suspect()
        # "crash": proven by its own crashes; "killed": accused by kills from outside,
        # which may have come from memory pressure that passes: the sample is tried
        # again in the next epoch. Proven by its own crashes, it is left out of later
        # tasks too, without another.
        stage = "killed" if outside else "crash"
        return LeaveOut(
            entry.seq, lost, death.worker_id, stage, why,
            whole_batch=poison is None, for_good=not outside,
        )  # fmt: skip

    def _resend(
        self, held: list[int], culprit: int | None, leave_out: LeaveOut | None
    ) -> tuple[tuple[Resend, ...], list[Any]]:
        """The tasks for a dead worker's replacement, and the samples tried alone in it.

        A suspect is tried first, before anything else the replacement runs: as a task
        of its own (same ``seq``: its reply is recognised by the book), or as its task
        when that holds no other sample. Every task that was ever running when its
        worker died is traced (its status page then names the sample)."""
        first: list[Resend] = []
        rest: list[Resend] = []
        probes: list[Any] = []
        for seq in held:
            if leave_out is not None and leave_out.seq == seq and leave_out.whole_batch:
                continue  # settled as an empty batch
            evidence = self._evidence.get(seq)
            task = Resend(
                seq, trace=seq == culprit or (evidence is not None and evidence.crashes > 0)
            )
            if evidence is None or not evidence.probing:
                rest.append(task)
                continue
            probes.append(evidence.suspect)
            if evidence.apart:
                first.append(Resend(seq, alone=(evidence.suspect,)))
                rest.append(task)
            else:
                first.append(task)
        rest.sort(key=lambda task: task.seq != culprit)  # what it was running, first
        return (*first, *rest), probes
