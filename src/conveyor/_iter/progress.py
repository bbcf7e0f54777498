"""What an iterator has handed out, kept so that a state can be written at any moment.

The loader holds the :class:`Progress` of its current iterator (not the
iterator: that would keep workers alive after the user's loop is gone), so
``state_dict()`` works mid-epoch, after a ``break`` and after the epoch.

The state depends only on what was handed out, never on what was prefetched:
the sampler's position is the prefix of batch positions handed out (plus,
with ``in_order=False``, the positions handed out beyond it), and each
worker's part is the state that came with the last batch handed out from it.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._task.dataset_calls import DatasetCall, calls_of
from .._task.dataset_state import WorkerState
from .._task.protocol import TaskFailed, TaskReply
from ..config import LoaderConfig, LoaderHistory
from ..distributed import process_group
from .cursor import SamplerCursor
from .state import ResumePoint, Written, write


@dataclass
class _Snapshot:
    """The state at a snapshot step (datasets with a state of their own)."""

    step: int
    prefix: int
    samples: int
    main: dict[str, Any]
    workers: tuple[WorkerState, ...]
    last_worker: int
    beyond: tuple[int, ...] = ()


@dataclass
class Progress:
    config: LoaderConfig
    history: LoaderHistory
    cursor: SamplerCursor
    num_workers: int
    base_seed: int
    epoch: int
    # Workers (or the dataset) carry a state of their own: snapshots every n steps,
    # and the steps since are fetched again on resume. Otherwise the state is exact
    # at every step and written from the counts when asked.
    per_worker: bool = False
    inline_state: Callable[[], WorkerState] | None = None  # without workers
    prefix: int = 0
    beyond: set[int] = field(default_factory=set)
    yielded: int = 0
    last_worker: int = -1
    finished: bool = False
    rng_after: list[Any] | None = None
    worker_states: list[WorkerState] = field(default_factory=list)
    # Workers whose state at the start of the epoch is still to be heard (per-worker).
    unreported: set[int] = field(default_factory=set)
    resumed_from: dict[str, Any] | None = None  # the loaded state, until something moves
    # Waits until every worker has reported its state at the start of the epoch
    # (a weak method of the iterator; returns None once the iterator is gone).
    settle: Callable[[], Callable[[], None] | None] | None = None
    # The dataset's calls (set_epoch...) as this epoch began: its workers' (see
    # _task.dataset_calls); a state taken after the epoch ended keeps the last ones made.
    calls: tuple[DatasetCall, ...] = ()
    _snapshot: _Snapshot | None = None
    _handed_from: set[int] = field(default_factory=set)  # workers whose state came with a batch

    def __post_init__(self) -> None:
        if not self.worker_states:
            self.worker_states = [WorkerState() for _ in range(self.num_workers)]
        if self.per_worker:
            self.unreported = set(range(self.num_workers))
        if self.last_worker < 0:
            self.last_worker = self.num_workers - 1  # torchdata's: worker 0 goes first
        self._every = self.config.options.snapshot_every
        self.calls = self._calls_now()

    def _calls_now(self) -> tuple[DatasetCall, ...]:
        return calls_of(self.config.dataset, self.config.options.epoch_calls)

    # --- what the iterators tell -------------------------------------------------------

    def start_from(self, point: ResumePoint | None) -> None:
        """The epoch begins (at the start, or where ``point`` left off)."""
        if point is not None and not point.finished:
            self.prefix = point.delivered
            self.beyond = set(point.beyond)
            self.yielded = point.yielded - point.replay
            self.last_worker = point.last_worker
            if self.per_worker:  # every worker restores its part of the state
                self.worker_states = list(point.workers)
                self.unreported.clear()
        self.commit()

    def began(self, worker_id: int, state: bytes | None) -> None:
        """A worker's pickled state as the epoch began, with its ``Ready`` or a persistent
        worker's first reply of the epoch: kept if it is the first heard."""
        if state is not None and worker_id in self.unreported:
            self.unreported.discard(worker_id)
            self.worker_reported(worker_id, pickle.loads(state))

    def worker_reported(self, worker_id: int, state: WorkerState) -> None:
        """A worker's state before it ran anything this epoch (start-up, or a persistent
        worker's new epoch). It may come after other workers' batches: it belongs to
        every snapshot taken before this worker hands anything out."""
        if self._delivered_from(worker_id):
            return
        self.worker_states[worker_id] = state
        snap = self._snapshot
        if snap is not None:
            workers = list(snap.workers)
            workers[worker_id] = state
            snap.workers = tuple(workers)

    def _delivered_from(self, worker_id: int) -> bool:
        return worker_id in self._handed_from

    def handed_out(
        self, seq: int, worker_id: int, state: WorkerState | None, empty: bool = False
    ) -> None:
        """The batch at ``seq`` reached the user (or its error did); ``empty``: every
        sample was left out, so the user got nothing, but the position is done."""
        self.resumed_from = None
        if not empty:
            self.yielded += 1
        self.last_worker = worker_id
        if state is not None and worker_id >= 0:
            self.worker_states[worker_id] = state
            self._handed_from.add(worker_id)
        if seq == self.prefix:
            self.prefix += 1
            beyond = self.beyond
            while beyond and self.prefix in beyond:
                beyond.discard(self.prefix)
                self.prefix += 1
            snap = self._snapshot  # saved sampler states before it are not needed
            self.cursor.forget_before(self.prefix if snap is None else snap.prefix)
        else:
            self.beyond.add(seq)
        if self.per_worker and self._every and self.yielded % self._every == 0:
            self.commit()

    def reply_handed_out(self, seq: int, worker_id: int, reply: TaskReply | None) -> None:
        """A worker's reply was handed out: a batch or the error raised in its place (both
        count), or nothing (every sample left out, an iterator ended: only the position
        is done); with the dataset's state after it, when it came."""
        empty = not isinstance(reply, TaskFailed) and getattr(reply, "payload", None) is None
        state = getattr(reply, "state", None)
        self.handed_out(seq, worker_id, pickle.loads(state) if state is not None else None, empty)

    def dropped(self, seq: int) -> None:
        """A batch fetched again on resume and dropped (it was handed out before)."""
        if seq == self.prefix:
            self.prefix += 1

    def ended(self) -> None:
        """The epoch ended: a state taken now resumes at the next epoch."""
        if not self.finished:
            self.finished = True
            self.rng_after = self.cursor.streams.capture()
            if self.per_worker:
                self.commit()  # each worker's state as the epoch ended, steps since: none

    def commit(self) -> None:
        if self.per_worker:
            self._snapshot = self._now()

    def _now(self) -> _Snapshot:
        """The state at this step."""
        return _Snapshot(
            step=self.yielded,
            prefix=self.prefix,
            samples=self.cursor.samples_before(self.prefix),
            main=self.cursor.state_at(self.prefix),
            workers=tuple(self.worker_states),
            last_worker=self.last_worker,
            beyond=tuple(sorted(self.beyond)),
        )

    # --- the state ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        wait = self.settle() if self.settle is not None else None
        if wait is not None:
            wait()
        if self.resumed_from is not None:
            return copy.deepcopy(self.resumed_from)
        # Without per-worker states the state is exact at every step: written from the counts.
        snap = self._snapshot if self._snapshot is not None else self._now()
        inline = None
        if self.num_workers == 0:
            inline = self.inline_state() if self.inline_state is not None else WorkerState()
        return write(
            Written(
                num_workers=self.num_workers,
                epoch=self.epoch,
                finished=self.finished,
                main=snap.main,
                samples=snap.samples,
                beyond=snap.beyond,
                yielded=self.yielded,
                snapshot_step=snap.step,
                steps_since=self.yielded - snap.step,
                base_seed=self.base_seed,
                workers=snap.workers,
                inline=inline,
                last_worker=snap.last_worker,
                skipped=tuple(self.history.skipped),
                rng_after=self.rng_after,
                global_after=self.cursor.streams.capture_global() if self.finished else None,
                dataset_len=_length(self.config),
                iterable_len=self.history.iterable_len,
                reseed=self.config.options.reseed,
                ranks=self.cursor.ranks_part(snap.prefix, snap.beyond),
                world=process_group(),
                calls=self._calls_now() if self.finished else self.calls,
            )
        )


def _length(config: LoaderConfig) -> int | None:
    if config.iterable:
        return None
    try:
        return len(config.dataset)
    except TypeError:
        return None
