"""What the task book answers the loop (:class:`NextStep`): values matched exhaustively
by the loop."""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import Entry

__all__ = ["EpochEnd", "GiveUp", "Handout", "NextStep", "Wait"]


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
