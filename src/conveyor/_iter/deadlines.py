"""Deadlines: when a task is stalled, when the loader times out.

A pure object beside the task book, whose ledger it reads through its view: it is
given the time and the workers' status pages, and answers how long the loop may block
(:meth:`Deadlines.next_deadline`) and what is overdue (:meth:`Deadlines.overdue`, as
:mod:`.facts`). Queries change nothing: the loop acts on what is overdue (warns, kills,
gives up) and says so (:meth:`Deadlines.reported`, ``TaskBook.give_up``,
``TaskBook.killing``). No process, no clock of its own, no warning;
tests/unit/test_deadlines.py tables its rules.

* ``timeout`` is torch's "no batch for N seconds", counted from when the user
  asks for a batch at the earliest; besides, a task running past ``timeout`` is
  stuck.
* With ``on_timeout="restart"``, a worker still starting is stuck only past
  ``max(timeout, STARTUP_LIMIT_S)``: a slow start (a cluster placing an actor,
  spawn importing torch on loaded cores) is no stuck sample, and its replacement
  would start as slowly, then fail the run as a start-up that never succeeds.
  With ``"raise"``, torch's rule: no batch for ``timeout`` seconds is the error,
  whatever the workers are doing.
* Of several tasks stuck past ``timeout``, the one the loop waits for is timed
  out first: its error is the next to raise (a later task's would wait behind it).
  A worker the loop killed or abandoned reads as gone (idle since now), and is
  told of (:meth:`Deadlines.ending`), until its death is heard: the same verdict
  never comes twice, even when no batch comes meanwhile (a Ray actor's death may be
  heard many seconds after the kill).
* A task running longer than the stall threshold, ``max(stall_warning, 10 *
  the workers' own time per batch)``, is reported once per time it is sent; so
  is a worker idle that long with a task waiting for it (frozen: SIGSTOP, a
  debugger).
"""

from __future__ import annotations

from .._task.protocol import Busy, Stage
from .._task.supervision import SupervisionPolicy
from ..errors import WorkerTimeoutError
from . import messages
from .facts import Overdue, Stalled, TimedOut
from .ledger import LedgerView, TaskRecord

STALL_FACTOR = 10  # a task is stalled past this many typical batch times...
STARTUP_LIMIT_S = 300.0  # on_timeout="restart": a start-up is stuck past this at least


class Deadlines:
    def __init__(
        self,
        ledger: LedgerView,
        policy: SupervisionPolicy,
        *,
        timeout: float = 0,
        now: float = 0.0,
        ends_stuck: str = "killed",
    ) -> None:
        """``ends_stuck``: what ending a stuck worker does to it, in words ("killed" a
        process; "abandoned" a thread, which cannot be killed)."""
        self._ledger = ledger
        self.policy = policy
        self.timeout = timeout
        self.ends_stuck = ends_stuck
        # Why no stuck worker can be replaced now (on_timeout="restart"), or None: the
        # loop says so before each query (too many abandoned threads still stuck).
        self.no_replacement: str | None = None
        self._counting_from = now
        self._reported: set[tuple[int, int, int]] = set()  # (epoch, seq, sends) of stalls told
        self._ending: set[int] = set()  # workers ended as stuck whose death is not heard yet

    @property
    def watching(self) -> bool:
        """Whether any limit applies (else the loop never needs a status page)."""
        return bool(self.timeout) or self.policy.stall_warning is not None

    def stall_threshold(self) -> float | None:
        if self.policy.stall_warning is None:
            return None
        return max(self.policy.stall_warning, STALL_FACTOR * self._ledger.batch_time)

    @property
    def last_progress(self) -> float:
        """Since when no batch has come that the user waited for: the last reply, or a
        later moment the count starts again at (:meth:`count_from`)."""
        return max(self._counting_from, self._ledger.last_reply_at)

    # --- what the deadlines are told ----------------------------------------------------

    def count_from(self, now: float) -> None:
        """``timeout`` counts from ``now`` at the earliest: the user asks for a batch
        (time spent in the training step is not the workers' fault, as in torch), an
        epoch starts, or a replacement worker starts (it gets a whole timeout)."""
        self._counting_from = max(self._counting_from, now)

    def started(self, now: float) -> None:
        """A worker started. With ``on_timeout="restart"`` its start-up was judged by
        the start-up limit, not by ``timeout``: the quiet while it started is no
        task's fault, and its first task gets a whole timeout (else a worker that
        started slowly would be killed as it began). With ``"raise"``, torch's rule."""
        if self.policy.on_timeout == "restart":
            self.count_from(now)

    def ending(self, worker_id: int) -> None:
        """The loop ended ``worker_id`` as stuck: no verdict on it until its death."""
        self._ending.add(worker_id)

    def died(self, worker_id: int) -> None:
        """``worker_id``'s death was heard: a replacement is judged afresh."""
        self._ending.discard(worker_id)

    def reported(self, stalled: Stalled) -> None:
        """The loop warned of ``stalled``: not again until the task is sent again."""
        entry = self._ledger.entry(stalled.seq)
        if entry is not None:
            self._reported.add(self._attempt(entry))

    # --- queries: they change nothing ---------------------------------------------------

    def next_deadline(self, now: float, workers: list[Busy]) -> float | None:
        """Seconds until a limit may be reached: a task running past ``timeout`` or the
        stall threshold, a worker idle that long with a task waiting for it, or no
        batch for ``timeout`` seconds. None: no limit applies. A task that starts
        later cannot reach a limit sooner than the smallest limit, which bounds
        every answer."""
        threshold = self.stall_threshold()
        limits = [x for x in (self.timeout or None, threshold) if x]
        if not limits:
            return None
        wakes = [min(limits)]
        for worker in workers:
            if worker.status.stage is not None:
                own = [self._stuck_after(worker)] if self.timeout else []
                own += [threshold] if threshold is not None else []
                wakes += [limit - worker.status.age_s for limit in own]
        if threshold is not None:
            wakes += [threshold - w.status.age_s for w, _ in self._not_started(workers)]
        waited = self._ledger.waited_for() if self.timeout else None
        if waited is not None:
            holder = self._holder(workers, waited)
            if holder is None or not self._exempt(holder):
                wakes.append(self.last_progress + self.timeout - now)
        return max(0.0, min(wakes))

    def overdue(self, now: float, workers: list[Busy]) -> list[Overdue]:
        """The timed-out worker, if any (of those running past ``timeout``, the one
        holding the batch the loop waits for, else the one running longest; else the
        one holding the batch waited for when no batch came for ``timeout`` seconds);
        otherwise the tasks past the stall threshold, running or not started, not
        reported yet."""
        ledger = self._ledger
        running = [w for w in workers if w.status.stage is not None]
        if self.timeout:
            stuck = [b for b in running if b.status.age_s >= self._stuck_after(b)]
            if stuck:
                return [self._timed_out(self._most_urgent(stuck))]
            waited = ledger.waited_for()
            quiet_s = now - self.last_progress
            if waited is not None and quiet_s >= self.timeout:
                holder = self._holder(workers, waited)
                assert holder is not None
                if not self._exempt(holder):
                    return [self._timed_out(holder, waited)]
        threshold = self.stall_threshold()
        if threshold is None:
            return []
        found: list[Overdue] = []
        for busy in running:
            status = busy.status
            entry = ledger.entry(status.seq) if status.epoch == ledger.epoch else None
            if status.age_s < threshold or entry is None or entry.worker_id != busy.worker_id:
                continue
            if self._attempt(entry) not in self._reported:
                report = messages.stall_report(busy, entry.indices, ledger.batch_time)
                found.append(Stalled(busy.worker_id, status.seq, report))
        for idle, entry in self._not_started(workers):
            if idle.status.age_s < threshold or self._attempt(entry) in self._reported:
                continue
            report = messages.not_started_report(idle, entry.seq, entry.indices, ledger.batch_time)
            found.append(Stalled(idle.worker_id, entry.seq, report))
        return found

    def _stuck_after(self, busy: Busy) -> float:
        """Seconds in its current stage after which a running worker is stuck."""
        if self._starting_slowly_is_allowed(busy):
            return max(self.timeout, STARTUP_LIMIT_S)
        return self.timeout

    def _exempt(self, holder: Busy) -> bool:
        """The holder of the awaited batch is not timed out for the quiet: it is still
        starting (and may, see below), or already ended as stuck."""
        return holder.worker_id in self._ending or self._starting_slowly_is_allowed(holder)

    def _starting_slowly_is_allowed(self, busy: Busy) -> bool:
        """A worker still starting, judged by the start-up limit, not by ``timeout``
        (``on_timeout="restart"`` only: see the module docstring)."""
        return self.policy.on_timeout == "restart" and busy.status.stage is Stage.STARTUP

    @staticmethod
    def _holder(workers: list[Busy], entry: TaskRecord) -> Busy | None:
        return next((w for w in workers if w.worker_id == entry.worker_id), None)

    def _most_urgent(self, stuck: list[Busy]) -> Busy:
        """The stuck worker whose error raises first: the one holding the batch the loop
        waits for; else the one stuck longest."""
        waited = self._ledger.waited_for()
        for busy in stuck:
            status = busy.status
            if waited is not None and (status.epoch, status.seq) == (
                self._ledger.epoch,
                waited.seq,
            ):
                return busy
        return max(stuck, key=lambda b: b.status.age_s)

    def _attempt(self, entry: TaskRecord) -> tuple[int, int, int]:
        return (self._ledger.epoch, entry.seq, entry.sends)

    def _not_started(self, workers: list[Busy]) -> list[tuple[Busy, TaskRecord]]:
        """Idle workers that hold an unanswered task: they have not started it."""
        found = []
        for worker in workers:
            if worker.status.stage is not None:
                continue
            held = self._ledger.held(worker.worker_id)
            if held:
                entry = self._ledger.entry(held[0])
                assert entry is not None
                found.append((worker, entry))
        return found

    def _timed_out(self, busy: Busy, waited: TaskRecord | None = None) -> TimedOut:
        ledger, worker_id, status = self._ledger, busy.worker_id, busy.status
        if waited is not None and status.stage is None:
            entry: TaskRecord | None = waited
            doing = messages.not_started(waited.seq, waited.indices, status.age_s)
            stage = "not started"
        else:
            entry = ledger.entry(status.seq) if status.epoch == ledger.epoch else None
            doing = messages.doing(status, entry is not None, entry.indices if entry else ())
            doing += f" for {status.age_s:.1f} s"
            stage = status.stage.value if status.stage is not None else "idle"
        if self.policy.on_timeout == "restart" and self.no_replacement is None:
            return TimedOut(worker_id, messages.stuck_reason(stage, self.timeout, self.ends_stuck))
        text = messages.timeout_text(self.timeout, busy, doing, stage, ledger.batch_time)
        if self.policy.on_timeout == "restart":
            text += f" It was not replaced: {self.no_replacement}"
        error = WorkerTimeoutError(
            text,
            worker_id=worker_id,
            pid=busy.pid,
            indices=entry.indices if entry is not None else (),
        )
        place = entry.seq if entry is not None else min(ledger.held(worker_id), default=None)
        return TimedOut(worker_id, None, error, place)
