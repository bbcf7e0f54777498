"""Streaming collate: each sample is written into its row of the batch as it is fetched.

Fetching a whole batch and then stacking it keeps every sample alive until the end: each
fresh array the dataset makes lands on memory the batch before left cold, and the stack
reads it all back. Writing each sample into its row as soon as ``__getitem__`` returns,
and dropping it, hands its memory straight back to the allocator, and the next sample is
made in it while it is still in cache (docs/design.md, "Streaming collate", has the
measurements).

Only arrays and tensors are written row by row: they are what a batch's bytes are. Every
other leaf (numbers, strings, a registered function's type, a container collate cannot
stream) is kept as the column of its values and collated at the end by the very rule
``default_collate`` applies to it, so the batch is the one ``default_collate`` builds.
The plan of a batch (``collate/_plan.py``: one node per place in the samples) is made
from its first sample and checked against every later one (and reused for the next batch
while its first sample fits): a sample that does not fit makes the caller collate the
batch as before, from the samples written so far rebuilt from their rows
(:meth:`RowBatch.samples`), never a wrong batch. This module keeps the batch being
written and the plan from batch to batch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from conveyor import collate as _collate
from conveyor.collate import _leaves
from conveyor.collate._plan import Node, Rows, make_plan, rows_of

__all__ = ["RowBatch", "RowWriter"]


class RowBatch:
    """One batch being written: rows so far, the memory it writes into."""

    def __init__(
        self,
        writer: RowWriter,
        size: int,
        collating: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        self.size = size
        self.rows = 0
        self._writer = writer
        self._collating = collating
        self._context: AbstractContextManager[Any] | None = None
        self.plan = writer.plan

    def context(self) -> AbstractContextManager[Any]:
        """Where collate writes (the transport's, entered around each allocation): made at
        the first need, so a batch that fails before takes no memory."""
        if self._context is None:
            self._context = self._collating()
        return self._context

    def write(self, sample: Any) -> bool:
        """Write ``sample`` into the next row; False if it does not fit the plan, or if
        no leaf of the batch is worth writing row by row (see _collate_plan.STREAM_MIN_BYTES): the
        batch is then collated as before."""
        row, plan = self.rows, self.plan
        if plan is not None and plan.write(row, sample):
            self.rows = row + 1
            return True
        if row or not self._writer.replan(self, sample):
            return False
        self.rows = 1
        return True

    def first_dropped(self) -> None:
        """The first sample written is garbage now (see :meth:`RowWriter.first_dropped`)."""
        self._writer.first_dropped()

    def samples(self) -> list[Any]:
        """The samples written so far, rebuilt from their rows (for collate as before)."""
        plan = self.plan
        return [] if plan is None else [plan.sample(row) for row in range(self.rows)]

    def finish(self) -> Any:
        """The batch, as the collate function makes it; raises if it cannot (the caller
        then collates :meth:`samples` as before)."""
        return self._writer.finish(self)


class RowWriter:
    """A runner's streaming collate: the plan of the last batch, and its collate function's
    rules (None from :meth:`for_collate` where the function is not a default one)."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn
        self.plan: Node | None = None
        self._key: Any = None  # the rules collate_fn had when the plan was made
        self._rules: Any = None  # those the plan uses (torch's, for a batch with tensors)
        self.streams = False  # the plan writes some leaf row by row, and it is worth it
        self._rows: list[Rows] = []  # the plan's leaves written row by row

    @staticmethod
    def for_collate(collate_fn: Callable[[Any], Any]) -> RowWriter | None:
        return RowWriter(collate_fn) if _collate.streams(collate_fn) else None

    def begin(
        self, size: int, collating: Callable[[], AbstractContextManager[Any]]
    ) -> RowBatch | None:
        """A batch of at most ``size`` samples; None when the last batch had no leaf worth
        writing row by row: this one is fetched and collated as before, and its first
        sample goes to :meth:`check`."""
        key = _collate.stream_rules(self.collate_fn)
        if key != self._key:  # registrations changed, or the worker turned to torch
            self.plan, self._key, self._rules, self.streams = None, key, key, False
        plan = self.plan
        if plan is not None and not self.streams:
            return None
        batch = RowBatch(self, size, collating)
        if plan is not None:
            plan.reset(batch)
        return batch

    def check(self, sample: Any) -> None:
        """The first sample of a batch collated as before (see :meth:`begin`): if it does
        not fit the last plan, the next batch makes a new one (it may stream)."""
        plan = self.plan
        if plan is None:
            return
        try:
            fits = plan.fits(sample)
        except Exception:
            fits = False
        if not fits:
            self.plan = None

    def replan(self, batch: RowBatch, sample: Any) -> bool:
        """A plan made from ``sample``, the first of ``batch`` (a new shape, or the first
        batch), and the sample written with it; False if it cannot be."""
        leaves, rules = self._rules = self._key
        try:
            plan = make_plan(sample, (), leaves, rules)
        except _leaves.NeedsTorch:  # a tensor in a worker deferring torch
            self._rules = leaves, rules = _collate.stream_rules(self.collate_fn, need_torch=True)
            plan = make_plan(sample, (), leaves, rules)
        plan.reset(batch)
        self.plan = batch.plan = plan
        self._rows = rows_of(plan)
        self.streams = bool(self._rows)
        return self.streams and plan.write(0, sample)

    def first_dropped(self) -> None:
        """The batch's first sample was dropped once written. If none of its arrays went
        with it, the dataset keeps them (rows of a table, images loaded once): writing
        rows one by one saves no memory and costs Python calls, so the next batches are
        collated as before (a batch of another shape tries again)."""
        if not any(rows.probe is not None and rows.probe() is None for rows in self._rows):
            self.streams = False

    def finish(self, batch: RowBatch) -> Any:
        plan = batch.plan
        assert plan is not None and batch.rows, "finish() after a sample was written"
        leaves, rules = self._rules
        with batch.context():  # columns are stacked into the transport's memory too
            try:
                return plan.finish(batch.rows, leaves, rules)
            except _leaves.NeedsTorch:
                # A column only torch can collate, in a worker deferring it: the whole
                # batch becomes torch's (default_collate does the same).
                leaves, rules = _collate.stream_rules(self.collate_fn, need_torch=True)
                return plan.finish(batch.rows, leaves, rules)
