"""The task book, the crash judge and the deadlines wired as the loop wires them, for
their table tests: facts in, decisions out, applied as the loop applies them. No
process, no clock, no sleep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor._iter.book import FILED, SURVIVED, TaskBook
from conveyor._iter.crashes import CrashJudge
from conveyor._iter.deadlines import Deadlines
from conveyor._iter.facts import GiveUpAt, Overdue, Restart, Stalled, TimedOut
from conveyor._iter.ledger import Entry
from conveyor._iter.messages import kill_reason
from conveyor._iter.tally import Tally
from conveyor._task.protocol import BatchDone, Busy, Died, Stage, Task, WorkerStatus
from conveyor._task.supervision import SupervisionPolicy
from conveyor.records import SkippedSample

DONE = object()  # a batch payload stand-in
SIGKILL, SIGSEGV, EXIT3 = -9, -11, 3  # exit codes: killed from outside, crashes of its own


@dataclass(frozen=True)
class Restarted:
    """A Restart verdict as the loop applies it: ``resend`` is the tasks the book made for
    the replacement, in order; the verdict's other fields read through."""

    verdict: Restart
    resend: tuple[Task, ...]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.verdict, name)


@dataclass
class Loop:
    book: TaskBook
    judge: CrashJudge
    deadlines: Deadlines
    skipped: list[SkippedSample]
    tally: Tally

    def die(self, death: Died, now: float) -> Restarted | None:
        """A worker died: the judge's Restart, applied; None when it gave up."""
        verdict = self.judge.on_death(death)
        self.deadlines.died(death.worker_id)
        if isinstance(verdict, GiveUpAt):
            self.book.give_up(verdict.error, verdict.place)
            self.book.not_replaced(death.worker_id)
            return None
        tasks = self.book.restarted(verdict, now)
        self.tally.restarted(verdict.worker_id, verdict.retried, death.charged)
        self.deadlines.count_from(now)
        return Restarted(verdict, tuple(tasks))

    def reply(self, seq: int, now: float | None = None, **kw: Any) -> bool:
        """Task ``seq`` answered with a batch; False if the reply is refused."""
        b = self.book
        reply = BatchDone(b.epoch, seq, DONE, **kw)
        entry = b.view.entry(seq)
        assert entry is not None
        filed = b.on_reply(entry.worker_id, reply, now=now)
        if filed == SURVIVED:
            self.judge.survived(seq)
        return filed == FILED

    def act(self, overdue: list[Overdue], stacks: str = "") -> list[Overdue]:
        """Do what the loop does with what is overdue (less warning and killing)."""
        for item in overdue:
            if isinstance(item, Stalled):
                self.deadlines.reported(item)
            elif isinstance(item, TimedOut):
                if item.reason is not None:
                    self.book.killing(item.worker_id, kill_reason(item.reason, stacks))
                self.deadlines.ending(item.worker_id)
                if item.error is not None:
                    self.book.give_up(item.error, item.place)
        return overdue

    def overdue(self, now: float, workers: list[Busy]) -> list[Overdue]:
        return self.act(self.deadlines.overdue(now, workers))


def loop(workers: int = 2, prefetch: int = 2, in_order: bool = True, **policy: Any) -> Loop:
    skipped: list[SkippedSample] = []
    timeout = policy.pop("timeout", 0)
    iterable = policy.pop("iterable", False)
    supervision = SupervisionPolicy(**policy)
    b = TaskBook(
        num_workers=workers,
        prefetch=prefetch,
        in_order=in_order,
        iterable=iterable,
        auto_collation=True,
        policy=supervision,
        skipped=skipped,
    )
    b.start_epoch(0, 100)
    judge = CrashJudge(b.view, supervision, iterable=iterable)
    deadlines = Deadlines(b.view, supervision, timeout=timeout)
    return Loop(b, judge, deadlines, skipped, Tally(workers))


def dispatch(b: TaskBook, batches: list[list[int]]) -> list[tuple[int, int]]:
    """Send as many of ``batches`` as the book allows; (worker, seq) of each sent."""
    sent = []
    for index in batches:
        worker = b.next_worker()
        if worker is None:
            break
        task = b.add(worker, index, now=0.0)
        assert task is not None
        sent.append((worker, task.seq))
    return sent


def step_kinds(b: TaskBook, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        s = b.next_step()
        out.append(s.seq if isinstance(s, Entry) else type(s).__name__)
        if not isinstance(s, Entry):
            break
    return out


def batches(n: int, size: int = 2) -> list[list[int]]:
    return [list(range(i * size, (i + 1) * size)) for i in range(n)]


def died(
    worker: int,
    seq: int,
    stage: Stage = Stage.FETCH,
    position: int = -1,
    code: int = SIGSEGV,
    epoch: int = 0,
) -> Died:
    return Died(worker, 4000 + worker, code, WorkerStatus(epoch, seq, stage, position, 0.1))


def probe_died(worker: int, seq: int, code: int = SIGSEGV, stage: Stage = Stage.FETCH) -> Died:
    """The death of a worker trying a suspect alone: a one-sample task, position 0."""
    return died(worker, seq, stage, position=0, code=code)
