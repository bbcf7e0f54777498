"""The loop's hands for dead, stalled and stuck workers.

The rules are in two pure objects: the :class:`~.crashes.CrashJudge` says what a
death means, the :class:`~.deadlines.Deadlines` what is overdue. The supervisor
does what they decide, through the pool's abilities: starts a replacement and
re-sends its tasks, reads the workers' status pages and stacks, warns, kills a
stuck worker; and tells the task book what it must know (a restart, a fatal
error at its place in the order).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

from .._task.compat import assert_never
from .._task.protocol import Busy, Died, Task
from .._workers.api import Pool
from .._workers.spec import WorkerSpec
from ..config import LoaderConfig
from ..errors import WorkerRestartedWarning, WorkerStallWarning
from ..records import LoaderStatistics
from . import messages
from .autotuning import WorkerCount
from .book import TaskBook
from .crashes import CrashJudge
from .deadlines import Deadlines
from .facts import GiveUpAt, Restart, Stalled, TimedOut
from .tally import Tally


class Supervisor:
    def __init__(
        self,
        config: LoaderConfig,
        book: TaskBook,
        pool: Pool,
        tally: Tally,
        now: float,
        specs: list[WorkerSpec] | None = None,
    ) -> None:
        """``specs``: the workers', from which more are made (``num_workers="auto"``)."""
        self._book, self._pool, self._tally = book, pool, tally
        forked = config.start_method.copies_memory
        self.judge = CrashJudge(book.view, config.policy, iterable=config.iterable, forked=forked)
        abilities = pool.abilities
        self._abandoner = abilities.abandon if abilities.kill is None else None
        ends = "abandoned" if self._abandoner is not None else "killed"
        self.deadlines = Deadlines(
            book.view, config.policy, timeout=config.timeout, now=now, ends_stuck=ends
        )
        self._recheck_at = 0.0  # when the status pages must be read again
        self.count: WorkerCount | None = None
        if config.tuner is not None and specs is not None and not config.fixed_count:
            self.count = WorkerCount(config.tuner, book, pool, tally, specs)

    def after_batch(self) -> None:
        if self.count is not None:
            self.count.after_batch()

    def statistics(self, skipped: int) -> LoaderStatistics:
        """``statistics()``: the tally, with what the pool can say of its workers."""
        book, usage = self._book, self._pool.abilities.usage
        stats = self._tally.statistics(
            book.epoch, skipped=skipped, now=time.monotonic(), pids=self.pids(),
            tasks=book.view.entries(), usage=usage,
        )  # fmt: skip
        if self.count is None:
            return stats
        count = self.count
        return replace(
            stats,
            notes=count.notes,
            settled_after_s=count.settled_after_s,
            auto_workers=book.serving,
        )

    def pids(self) -> list[int | None]:
        inspect = self._pool.abilities.inspect
        return inspect.pids() if inspect is not None else [None] * self._pool.num_workers

    # --- dead workers -------------------------------------------------------------------

    def on_death(self, died: Died) -> bool:
        """Act on a worker's death; whether a replacement was started."""
        verdict = self.judge.on_death(died)
        self.deadlines.died(died.worker_id)
        match verdict:
            case Restart():
                now = time.monotonic()
                tasks = self._book.restarted(verdict, now)
                self._tally.restarted(verdict.worker_id, verdict.retried, died.charged)
                self.deadlines.count_from(now)  # the replacement gets a whole timeout
                self._restart(verdict, tasks)
                return True
            case GiveUpAt(error=error, place=place):
                self._book.give_up(error, place)  # raised at its place in the order
                self._book.not_replaced(died.worker_id)
                return False
            case _:
                assert_never(verdict)

    def _restart(self, decision: Restart, tasks: list[Task]) -> None:
        self._pool.restart(decision.worker_id)  # a fork waits for a pin in flight (ForkGate)
        for task in tasks:
            self._pool.send(decision.worker_id, task)
        if decision.report:  # (a worker restarted with another's process: said there)
            warnings.warn(decision.report, WorkerRestartedWarning, stacklevel=6)

    # --- deadlines ----------------------------------------------------------------------

    def wake_in(self) -> float | None:
        """Seconds the loop may block: until a running task may reach ``timeout`` or
        the stall threshold (None: no limit applies).

        Reading the status pages costs a little, so it is done only once the
        previous answer has run out.
        """
        if not self.deadlines.watching:
            return None
        now = time.monotonic()
        if now < self._recheck_at:
            return self._recheck_at - now
        wake = self.deadlines.next_deadline(now, self._workers_now())
        if wake is None:
            return None
        self._recheck_at = now + wake
        return wake

    def check(self) -> None:
        """The loop's wait ran out: act on what is overdue."""
        if self._abandoner is not None:  # threads: how many more may be abandoned
            self.deadlines.no_replacement = self._abandoner.no_replacement()
        for overdue in self.deadlines.overdue(time.monotonic(), self._workers_now()):
            match overdue:
                case Stalled(worker_id=worker_id, report=report):
                    stacks = self._stacks(worker_id) or "(unavailable)"
                    text = f"{report} Its current Python stack:\n{stacks}"
                    warnings.warn(text, WorkerStallWarning, stacklevel=5)
                    self.deadlines.reported(overdue)
                case TimedOut(worker_id=worker_id, reason=reason, error=error, place=place):
                    stacks = self._stacks(worker_id)
                    if reason is not None:  # on_timeout="restart": its death is then
                        why = messages.kill_reason(reason, stacks)  # like any other
                        self._book.killing(worker_id, why)
                    if error is not None:  # otherwise the loader gives up in its place
                        text = messages.with_stack(error.args[0], stacks)
                        if self._abandoner is not None:
                            text += f"\nThe thread was abandoned: {messages.ABANDONED_THREAD}."
                        error.args = (text,)
                        self._book.give_up(error, place)
                    self._end_stuck(worker_id)
                case _:
                    assert_never(overdue)

    def _end_stuck(self, worker_id: int) -> None:
        """A worker known stuck: killed now, or abandoned where it cannot be killed (a
        thread). Either way a Died follows, and it reads as gone until replaced, so the
        same verdict never comes twice."""
        self.deadlines.ending(worker_id)
        kill = self._pool.abilities.kill
        if kill is not None:
            kill(worker_id)
        elif self._abandoner is not None:
            self._abandoner.abandon(worker_id)

    def _workers_now(self) -> list[Busy]:
        """Every worker as its status page says now (running a task, or idle)."""
        inspect = self._pool.abilities.inspect
        if inspect is None:
            return []  # nothing can be seen of them: no deadline is checked
        pids = inspect.pids()
        return [Busy(i, pids[i], inspect.status(i)) for i in range(self._pool.num_workers)]

    def _stacks(self, worker_id: int) -> str:
        inspect = self._pool.abilities.inspect
        return inspect.stacks(worker_id) if inspect is not None else ""
