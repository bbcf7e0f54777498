"""A task's streamed fetch: each sample written into its row of the batch as it comes.

Where the runner streams (a default collate, a map-style dataset fetched one sample at a
time: see ``collate/_rows.py``), :func:`stream` fetches each sample and hands it to the
batch at once, leaving out the ones that fail under ``on_error="skip"``, and
:func:`finish` makes the batch whole. A sample that does not fit the batch's plan turns
the rest of the batch back to the ordinary path, fetched samples kept and collated by the
collate function itself, so the batch, or its error, is the one it would have been.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor._task.fetch import StopCheck, StopRequested, stop_in_getitem
from conveyor._task.outcomes import (
    Collated,
    Failed,
    LeftOut,
    NothingLeft,
    TaskOutcome,
    batch_failed,
)
from conveyor._task.protocol import Stage
from conveyor.collate._errors import collate_context
from conveyor.collate._rows import RowBatch
from conveyor.errors import Culprit

__all__ = ["Streamed", "finish", "stream"]


@dataclass
class Streamed:
    """What a streamed fetch gathered (see :func:`stream`)."""

    batch: RowBatch
    kept: list[Any]  # dataset indices fetched
    left_out: list[LeftOut]  # samples that failed (skipped)
    rest: list[Any] | None  # samples to collate as before, once one did not fit


def stream(
    dataset: Any,
    batch: RowBatch,
    indices: list[Any],
    exclude: tuple[Any, ...],
    on_position: Callable[[int], None] | None,
    *,
    skip_errors: bool,
    stop: StopCheck | None = None,
) -> Streamed | NothingLeft | Failed:
    """Fetch each sample and write it into its row at once (see collate/_rows.py): what
    was fetched, or the failure that ends the batch. From the first sample that does
    not fit the batch's plan on, samples are kept as they are (those before rebuilt
    from their rows), and the batch is collated as before. ``stop`` is asked before
    each sample (:class:`~conveyor._task.fetch.StopRequested` ends the batch)."""
    write = batch.write
    wanted = [(p, i) for p, i in enumerate(indices) if i not in exclude] if exclude else None
    left_out: list[LeftOut] = []
    skipped: set[int] = set()  # their positions
    rest: list[Any] | None = None  # samples collated as before, once one did not fit
    for position, i in wanted if wanted is not None else enumerate(indices):
        if stop is not None and stop():
            raise StopRequested
        if on_position is not None:
            on_position(position)
        try:
            sample = dataset[i]
        except Exception as exc:
            if not skip_errors:
                culprit = Culprit((i,))
                if isinstance(exc, StopIteration):
                    exc = stop_in_getitem(exc, indices, culprit)
                return Failed(Stage.FETCH, exc, culprit)
            left_out.append(LeftOut(i, Stage.FETCH, exc))
            skipped.add(position)
            continue
        if rest is not None:
            rest.append(sample)
            continue
        try:
            written = write(sample)
        except Exception:  # it does not fit the plan (whatever it is)
            written = False
        if not written:
            rest = [*batch.samples(), sample]
            continue
        # Its memory goes back now, for the next sample to reuse while it is in cache.
        del sample
        if batch.rows == 1:
            batch.first_dropped()
    if skipped:
        pairs = enumerate(indices) if wanted is None else wanted
        kept = [i for p, i in pairs if p not in skipped]
    else:
        kept = indices if wanted is None else [i for _, i in wanted]
    if not kept:
        return NothingLeft(tuple(left_out))
    return Streamed(batch, kept, left_out, rest)


def finish(
    streamed: Streamed, collate_fn: Callable[[Any], Any], *, skip_errors: bool
) -> TaskOutcome:
    """The streamed batch made whole, or collated as before where it must be."""
    batch, kept, rest = streamed.batch, streamed.kept, streamed.rest
    left_out = tuple(streamed.left_out)
    with collate_context(kept):
        if rest is None:
            try:
                return Collated(batch.finish(), kept, left_out)
            except Exception:  # the collate function's own rules say what happens
                rest = batch.samples()
        try:
            with batch.context():
                made = collate_fn(rest)
        except Exception as exc:
            return batch_failed(Stage.COLLATE, exc, kept, left_out, skip_errors=skip_errors)
    return Collated(made, kept, left_out)
