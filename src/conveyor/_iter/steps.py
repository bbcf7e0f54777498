"""What the task book answers the loop (:class:`NextStep`): values matched exhaustively
by the loop. A reply to hand out is its ledger :class:`~.ledger.Entry` itself (one a
batch: no wrapper made for it); waiting and the epoch's end are the singletons
:data:`WAIT` and :data:`EPOCH_END`."""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import Entry

__all__ = ["EPOCH_END", "WAIT", "EpochEnd", "GiveUp", "NextStep", "Wait"]


@dataclass(frozen=True)
class GiveUp:
    error: BaseException


@dataclass(frozen=True)
class Wait:
    """Nothing can be handed out until a worker answers."""


@dataclass(frozen=True)
class EpochEnd:
    pass


WAIT, EPOCH_END = Wait(), EpochEnd()

# An Entry: hand its reply out (a batch, its error, or nothing: every sample left out).
NextStep = Entry | GiveUp | Wait | EpochEnd
