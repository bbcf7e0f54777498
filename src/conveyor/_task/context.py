"""Where an exception raised by user code came from, told to the user.

A user's exception (``__getitem__``, ``collate_fn``, ``worker_init_fn``...) is raised with
its own type; what conveyor adds is a :class:`WorkerContext` (the worker, the stage, the
batch and, where it can tell, the sample: a :class:`Culprit`) and a note that says it in
words. Kept apart from :mod:`conveyor.errors`, which holds conveyor's own exceptions, as
none of this is an exception; ``conveyor.errors`` re-exports every name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Culprit", "WorkerContext", "add_note", "attach_worker_context"]

# The public names live in conveyor.errors: pickles and reprs name them from there.
_PUBLIC_MODULE = "conveyor.errors"


@dataclass(frozen=True)
class Culprit:
    """Which sample of its batch an error came from, as far as conveyor can tell."""

    #: The dataset indices of the samples at fault (map-style datasets).
    indices: tuple[Any, ...] = ()
    #: Iterable-style: the failing item's position in the stream of the worker (or of the
    #: main process), from 0 at the epoch's start, or at the state it resumed from.
    stream_item: int | None = None
    #: The stream resumed from a checkpoint: ``stream_item`` counts from there.
    resumed: bool = False
    #: ``__getitems__`` fetched the batch at once: no one sample can be named.
    whole_batch: bool = False

    __module__ = _PUBLIC_MODULE


@dataclass(frozen=True)
class WorkerContext:
    """Where an exception raised by user code came from: the worker (``worker_id`` and
    ``pid`` are None for the main process, ``num_workers=0``), the stage, the batch
    (``seq``: its position in the epoch) and its dataset ``indices``, and the sample
    that raised (``culprit``) where conveyor can tell."""

    #: The worker's id (None: the main process, ``num_workers=0``).
    worker_id: int | None
    #: The worker's process id (None: the main process).
    pid: int | None
    #: What it was doing: ``"worker_init"``, ``"fetch"``, ``"collate"``, ``"transfer"``
    #: or ``"decode"``.
    stage: str
    #: The dataset indices of the batch.
    indices: tuple[Any, ...] = ()
    #: The worker's traceback, as text.
    traceback: str = ""
    #: The epoch the batch belongs to.
    epoch: int = 0
    #: The batch's position in the epoch (-1: none, e.g. at start-up).
    seq: int = -1
    #: The sample that raised, where conveyor can tell.
    culprit: Culprit | None = None

    __module__ = _PUBLIC_MODULE

    def describe(self) -> str:
        """``worker 1 (pid 42) during fetch of dataset index 77, in batch 4 (dataset
        indices [64, 65, ...])``."""
        if self.worker_id is None:
            who = "(main process, num_workers=0)"
        else:
            who = f"worker {self.worker_id} (pid {self.pid})"
        what = self._what()
        return f"{who} during {self.stage}" + (f" of {what}" if what else "")

    def _what(self) -> str:
        culprit, batch = self.culprit, self._batch()
        if culprit is None:
            return batch
        if culprit.whole_batch:
            return (
                f"{batch}, in the dataset's __getitems__, which fetches the batch at once: "
                "which of its samples raised is not known"
            )
        if culprit.stream_item is not None:
            stream = "the dataset's" if self.worker_id is None else f"worker {self.worker_id}'s"
            since = "the state it resumed from" if culprit.resumed else "the epoch's start"
            item = f"item {culprit.stream_item} of {stream} stream (counted from {since})"
            return f"{item}, for batch {self.seq}" if self.seq >= 0 else item
        if not culprit.indices:
            return batch
        if len(self.indices) == 1 and culprit.indices == self.indices:
            # A batch of one sample (batch_size=None): the sample is the batch.
            return f"dataset index {self.indices[0]!r}" + (
                f" (batch {self.seq})" if self.seq >= 0 else ""
            )
        plural = len(culprit.indices) > 1
        named = f"dataset {'indices' if plural else 'index'} " + ", ".join(
            repr(i) for i in culprit.indices[:16]
        )
        if len(culprit.indices) > 16:
            named += f", ... ({len(culprit.indices)} in all)"
        if self.stage == "fetch" and not plural:
            return f"{named}, in {batch}" if batch else named
        return f"{batch}, caused by {named}" if batch else f"{named} (the cause)"

    def _batch(self) -> str:
        """``batch 4 (dataset indices [...])``, or as much of it as is known."""
        indices = f"dataset indices {_short_indices(self.indices)}" if self.indices else ""
        if self.seq < 0:
            return indices
        return f"batch {self.seq} ({indices})" if indices else f"batch {self.seq}"


def _short_indices(indices: tuple[Any, ...], limit: int = 16) -> str:
    shown = ", ".join(repr(i) for i in indices[:limit])
    more = f", ... ({len(indices)} in all)" if len(indices) > limit else ""
    return f"[{shown}{more}]"


def attach_worker_context(exc: BaseException, context: WorkerContext) -> BaseException:
    """Annotate ``exc`` (raised by user code, raised again to the user) with where it
    happened.

    The exception keeps its type and arguments, so ``str(exc)`` and ``except``
    clauses behave exactly as if it had been raised in-process. Where it happened
    (the worker, the batch, the sample) and the worker's traceback are added as a
    note, which Python prints under the traceback; ``exc.conveyor_context`` holds
    them for programs.
    """
    with contextlib.suppress(AttributeError):
        exc.conveyor_context = context  # type: ignore[attr-defined]
    note = f"Raised in DataLoader {context.describe()}.\n" + (
        f"Worker traceback (most recent call last):\n{_indent(context.traceback)}"
        if context.traceback
        else ""
    )
    return add_note(exc, note.rstrip())


def add_note(exc: BaseException, note: str) -> BaseException:
    """``exc.add_note(note)``, also on Python 3.10 (where notes are not printed)."""
    notes = list(getattr(exc, "__notes__", None) or [])
    notes.append(note)
    with contextlib.suppress(AttributeError):  # exceptions with __slots__, no dict
        exc.__notes__ = notes  # type: ignore[attr-defined]
    return exc


def _indent(text: str) -> str:
    body = text.rstrip().splitlines()
    if body and body[0].startswith("Traceback"):
        body = body[1:]
    return "\n".join(body)
