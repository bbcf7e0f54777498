"""The plain values the task book, its judges and the loop hand each other.

Where an epoch's dispatch begins, what a worker's death decides, what a deadline
finds overdue: facts, not objects with behaviour. They import nothing, so the book,
the crash judge, the deadlines and the loop can all speak them without depending on
one another (the judges read the book's ledger through its view and answer with
these; the book applies them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "GiveUpAt",
    "LeaveOut",
    "Overdue",
    "Position",
    "Resend",
    "Restart",
    "Stalled",
    "TimedOut",
    "Verdict",
]


@dataclass(frozen=True)
class Position:
    """Where an epoch's dispatch begins. Resumed: the first position not handed out,
    the worker round-robin goes on with, and the positions past the first handed out
    before the state was taken (``in_order=False``: they get no task)."""

    first_seq: int = 0
    first_worker: int = 0
    handed_out_before: frozenset[int] = frozenset()


# --- a worker died (the crash judge's verdicts) ----------------------------------------


@dataclass(frozen=True)
class Resend:
    """One task of a dead worker, for its replacement: the task as it stands
    (``trace``: the replacement's status page names each sample as it is fetched), or,
    with ``alone`` (its suspect sample), that sample alone as a task of the same seq."""

    seq: int
    trace: bool = False
    alone: tuple[Any, ...] = ()  # (the suspect,): fetched alone, traced


@dataclass(frozen=True)
class LeaveOut:
    """Samples of task ``seq`` proven to kill workers, left out under ``on_error="skip"``:
    out of its batch (``whole_batch``: the batch is settled empty), recorded as left out
    by ``worker_id`` at ``stage`` ("crash", or "killed" when kills from outside accused
    them) for ``why``, and out of every later task when ``for_good``."""

    seq: int
    samples: tuple[Any, ...]
    worker_id: int
    stage: str
    why: str
    whole_batch: bool
    for_good: bool


@dataclass(frozen=True)
class Restart:
    """Start a replacement for ``worker_id`` and send it ``resend``, in that order."""

    worker_id: int
    resend: tuple[Resend, ...]
    report: str  # what happened, for a WorkerRestartedWarning ("": said by another's)
    retried: int = 0  # the dead worker's tasks re-sent (a suspect tried alone not counted)
    leave_out: LeaveOut | None = None  # samples proven to kill workers (on_error="skip")
    start_death: bool = False  # it died starting up, of its own doing: one more in a row

    @property
    def probed_apart(self) -> frozenset[int]:
        """The seqs whose suspect goes first as a task of its own: their first reply is
        only its verdict."""
        return frozenset(resend.seq for resend in self.resend if resend.alone)


@dataclass(frozen=True)
class GiveUpAt:
    """Start no replacement: raise ``error`` at ``place`` in the order (see
    ``TaskBook.give_up``)."""

    error: BaseException
    place: int | None


Verdict = Restart | GiveUpAt


# --- what is overdue (the deadlines' findings) ------------------------------------------


@dataclass(frozen=True)
class Stalled:
    worker_id: int
    seq: int
    report: str  # the warning's text, less the worker's stack (the loop adds it)


@dataclass(frozen=True)
class TimedOut:
    """End ``worker_id`` (stuck past ``timeout``). With ``on_timeout="restart"`` its
    death is then handled like any other (the book is told ``reason``); otherwise
    ``error`` is raised at ``place`` in the order (``TaskBook.give_up``)."""

    worker_id: int
    reason: str | None
    error: BaseException | None = None
    place: int | None = None


Overdue = Stalled | TimedOut
