"""What the task book answers the loop (:class:`NextStep`), and where an epoch's dispatch
begins (:class:`Position`): plain values, matched exhaustively by the loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .book import Entry

__all__ = ["EpochEnd", "GiveUp", "Handout", "NextStep", "Position", "Wait"]


@dataclass(frozen=True)
class Position:
    """Where an epoch's dispatch begins. Resumed: the first position not handed out,
    the worker round-robin goes on with, and the positions past the first handed out
    before the state was taken (``in_order=False``: they get no task)."""

    first_seq: int = 0
    first_worker: int = 0
    handed_out_before: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Handout:
    """The next task's reply for the user: a batch, its error, or nothing (emptied)."""

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
