"""Run one task: fetch its samples, leave out the ones that fail, collate.

The same runner serves the main process (``num_workers=0``) and every worker,
so both follow torch's fetching rules (``__getitems__``, iterable datasets
filling a batch, ``drop_last``) and conveyor's skipping rules alike. It
raises nothing from user code: every outcome is a value the caller acts on
(``_task/outcomes.py``, re-exported here). Where samples are written into their rows
as they come, the fetch is ``_task/stream.py``'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from conveyor._task import stream as _task_stream
from conveyor._task.dataset_state import WorkerState
from conveyor._task.fetch import (
    FetchError,
    IterableFetcher,
    MapFetcher,
    StopCheck,
    StopRequested,
    batch_indices,
    stop_in_getitem,
)
from conveyor._task.outcomes import (
    UNWATCHED,
    Abandoned,
    Collated,
    Exhausted,
    Failed,
    LeftOut,
    NothingLeft,
    TaskOutcome,
    Watcher,
    batch_failed,
)
from conveyor._task.protocol import Stage
from conveyor.collate._errors import collate_context
from conveyor.collate._rows import RowBatch, RowWriter
from conveyor.sampling._reseed import Reseed
from conveyor.stateful import is_stateful, load_into, save_of

__all__ = [
    "Abandoned",
    "Collated",
    "Exhausted",
    "Failed",
    "LeftOut",
    "NothingLeft",
    "TaskOutcome",
    "TaskRunner",
    "Watcher",
]


class TaskRunner:
    """Fetch → skip → collate for one loader's dataset (see the module docstring)."""

    def __init__(
        self,
        dataset: Any,
        *,
        iterable: bool,
        auto_collation: bool,
        collate_fn: Callable[[Any], Any],
        drop_last: bool,
        skip_errors: bool,
        resume: WorkerState | None = None,
    ) -> None:
        """``resume``: a worker's saved state, restored in torchdata's order: the
        dataset's state, then ``iter(dataset)`` once, then the iterator's state."""
        self.dataset = dataset
        self.fetcher: MapFetcher | IterableFetcher
        if resume is not None:
            load_into(dataset, resume.dataset_state)
        if iterable:
            self.fetcher = IterableFetcher(dataset, auto_collation, collate_fn, drop_last)
            if resume is not None:
                load_into(self.fetcher.iterator, resume.iter_state)
                self.fetcher.ended = resume.ended
                # Its items are counted from there (without a state, the epoch is replayed).
                self.fetcher.resumed = resume.iter_state is not None
        else:
            self.fetcher = MapFetcher(dataset, auto_collation, collate_fn)
        # Samples written into their rows as they come (see collate/_rows.py): one at a time
        # from a map-style dataset, into a batch that a default collate makes.
        self.rows: RowWriter | None = None
        if isinstance(self.fetcher, MapFetcher) and auto_collation and not self.fetcher.batched:
            self.rows = RowWriter.for_collate(collate_fn)
        self.iterable = iterable
        self.auto_collation = auto_collation
        # Seconds the last run spent fetching and collating (statistics, trace).
        self.fetch_s = self.collate_s = 0.0
        self.collate_fn = collate_fn
        # Iterable datasets cannot skip: their samples have no index to record.
        self.skip_errors = skip_errors and not iterable

    def new_epoch(self) -> None:
        if isinstance(self.fetcher, IterableFetcher):
            self.fetcher.restart()

    @property
    def stateful(self) -> bool:
        """The dataset (or its iterator) keeps a state of its own to save."""
        if is_stateful(self.dataset):
            return True
        return isinstance(self.fetcher, IterableFetcher) and is_stateful(self.fetcher.iterator)

    def state(self) -> WorkerState:
        """The dataset's state now (and its iterator's), as torchdata lays it out."""
        fetcher = self.fetcher
        if not isinstance(fetcher, IterableFetcher):
            return WorkerState(save_of(self.dataset))
        iterator = fetcher.iterator
        # A dataset that is its own iterator is saved once, as the iterator.
        dataset_state = None if iterator is self.dataset else save_of(self.dataset)
        return WorkerState(dataset_state, save_of(iterator), fetcher.ended, iterable=True)

    def run(
        self,
        index: Any,
        *,
        exclude: tuple[Any, ...] = (),
        trace: bool = False,
        watcher: Watcher = UNWATCHED,
        collating: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
        reseed: Reseed | None = None,
    ) -> TaskOutcome:
        """One task. ``exclude`` leaves dataset indices out without fetching them;
        ``trace`` reports each sample's position before fetching it (a retry
        after a crash, to name the sample that kills the worker); ``reseed``
        seeds the random generators before the batch or each sample. Before each
        sample, and before collating, the ``watcher`` is asked whether the worker was
        told to stop: then the batch is :class:`Abandoned` (a thread worker at the
        interpreter's exit waits for one sample, not for a whole batch)."""
        started = time.monotonic()
        self.fetch_s = self.collate_s = 0.0
        indices = None if self.iterable else batch_indices(index, self.auto_collation)
        per_sample = reseed is not None and reseed.mode == "sample" and not self.iterable
        if reseed is not None and not per_sample:
            reseed.before_batch(items=self.iterable)
        on_position = _position_hook(watcher if trace else None, reseed)
        stop = watcher.stop_check
        fetched: _task_stream.Streamed | _Fetched | TaskOutcome
        try:
            streaming = self._streaming(indices, exclude, collating)
            if streaming is not None:
                assert indices is not None
                fetched = _task_stream.stream(
                    self.dataset, streaming, indices, exclude, on_position,
                    skip_errors=self.skip_errors, stop=stop,
                )  # fmt: skip
            else:
                one_by_one = bool(trace or exclude or per_sample)
                fetched = self._fetch(
                    index, indices, exclude, one_by_one, on_position, reseed, stop
                )
        except StopRequested:
            return Abandoned()
        if not isinstance(fetched, (_task_stream.Streamed, _Fetched)):
            return fetched
        if stop is not None and stop():  # past the last sample: no collate either
            return Abandoned()
        collating_from = time.monotonic()
        self.fetch_s = collating_from - started
        watcher.stage(Stage.COLLATE)
        if per_sample:
            assert reseed is not None
            reseed.before_collate()
        if isinstance(fetched, _task_stream.Streamed):
            outcome = _task_stream.finish(fetched, self.collate_fn, skip_errors=self.skip_errors)
        else:
            outcome = self._collate(fetched, collating)
        self.collate_s = time.monotonic() - collating_from
        return outcome

    def _fetch(
        self,
        index: Any,
        indices: list[Any] | None,
        exclude: tuple[Any, ...],
        one_by_one: bool,
        on_position: Callable[[int], None] | None,
        reseed: Reseed | None,
        stop: StopCheck | None,
    ) -> _Fetched | TaskOutcome:
        """The batch's samples, fetched at once or (``one_by_one``, or to leave failing
        ones out) one at a time; or the outcome that ends the task."""
        fetcher = self.fetcher
        left_out: tuple[LeftOut, ...] = ()
        try:
            data: Any = _NOT_FETCHED
            if isinstance(fetcher, MapFetcher) and self.skip_errors and not one_by_one:
                # Skipping needs to know which sample failed, but samples rarely fail:
                # fetch the batch at once, and one by one only when it raises.
                try:
                    data = fetcher.fetch(index, stop)
                except Exception:
                    if reseed is not None:
                        reseed.before_batch(items=False)  # the draws a clean pass makes
            if (
                data is _NOT_FETCHED
                and isinstance(fetcher, MapFetcher)
                and (one_by_one or self.skip_errors)
            ):
                assert indices is not None
                samples, indices, failed = fetcher.fetch_each(
                    indices, exclude=exclude, tolerate=self.skip_errors,
                    on_position=on_position, stop=stop,
                )  # fmt: skip
                left_out = tuple(LeftOut(i, Stage.FETCH, e) for i, e in failed)
                if not samples:
                    return NothingLeft(left_out)
                data = samples if self.auto_collation else samples[0]
            elif data is _NOT_FETCHED:
                data = fetcher.fetch(index, stop)
        except StopIteration as exc:
            if self.iterable:
                return Exhausted()
            return Failed(Stage.FETCH, stop_in_getitem(exc, indices, None))
        except FetchError as failed:
            error, culprit = failed.error, failed.culprit
            if isinstance(error, StopIteration) and not self.iterable:
                error = stop_in_getitem(error, indices, culprit)
            return Failed(Stage.FETCH, error, culprit)
        except Exception as exc:
            return Failed(Stage.FETCH, exc)
        if self.rows is not None and data:
            self.rows.check(data[0])  # the next batch may stream
        return _Fetched(data, indices, left_out)

    def _collate(
        self, fetched: _Fetched, collating: Callable[[], AbstractContextManager[Any]]
    ) -> TaskOutcome:
        indices, left_out = fetched.indices, fetched.left_out
        try:
            with collating(), collate_context(indices):
                batch = self.collate_fn(fetched.data)
        except Exception as exc:
            return self.batch_failed(Stage.COLLATE, exc, indices, left_out)
        return Collated(batch, indices, left_out)

    def _streaming(
        self,
        indices: list[Any] | None,
        exclude: tuple[Any, ...],
        collating: Callable[[], AbstractContextManager[Any]],
    ) -> RowBatch | None:
        """A batch to write sample by sample (see _task/stream.py), or None: as before."""
        if self.rows is None or not indices:  # (an empty batch: collate says what it is)
            return None
        size = sum(1 for i in indices if i not in exclude) if exclude else len(indices)
        if size == 0:  # every sample left out: nothing to write (nor to fetch)
            return None
        return self.rows.begin(size, collating)

    def batch_failed(
        self,
        stage: Stage,
        error: Exception,
        indices: list[Any] | None,
        left_out: tuple[LeftOut, ...] = (),
    ) -> NothingLeft | Failed:
        """A batch failed after fetching (collate, transfer): under ``"skip"`` each
        of its samples is left out with the error; otherwise the task fails."""
        return batch_failed(stage, error, indices, left_out, skip_errors=self.skip_errors)


_NOT_FETCHED = object()


@dataclass
class _Fetched:
    """A batch's samples fetched (see TaskRunner._fetch)."""

    data: Any  # the samples (one sample without automatic batching)
    indices: list[Any] | None  # their dataset indices; None for iterable datasets
    left_out: tuple[LeftOut, ...] = ()


def _position_hook(watcher: Watcher | None, reseed: Reseed | None) -> Callable[[int], None] | None:
    """What runs before each sample of a sample-by-sample fetch."""
    if reseed is None or reseed.mode != "sample":
        return watcher.position if watcher is not None else None
    if watcher is None:
        return reseed.before_sample

    def both(position: int) -> None:
        watcher.position(position)
        reseed.before_sample(position)

    return both
