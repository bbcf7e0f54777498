"""The loop's waiting: block on the pool until a worker answers or dies (or a deadline
passes), and file what came (:class:`Receiving`, the iterator's base, as the pool's
readings are its own: see multiprocess.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._task.compat import assert_never
from .._task.protocol import (
    BatchDone,
    Died,
    IterationEnded,
    Ready,
    RoomAhead,
    StartupFailed,
    TaskFailed,
    TaskReply,
)
from .._workers.api import BatchHandle, Pool, Received
from ..config import LoaderConfig
from . import failures
from .book import FILED, SURVIVED, TaskBook
from .progress import Progress
from .supervisor import Supervisor
from .tally import Tally

__all__ = ["Receiving"]


class Receiving:
    """The iterator's side that waits (MultiprocessIterator's base: it keeps these)."""

    _config: LoaderConfig
    _book: TaskBook
    _pool: Pool
    _tally: Tally
    _supervisor: Supervisor
    _run_ahead: Callable[[BatchHandle], RoomAhead | None] | None
    progress: Progress
    closed: bool

    def _top_up(self, now: float) -> None: ...  # (the iterator's)

    def _pid(self, worker_id: int) -> int | None: ...  # (the iterator's)

    def _await_ready(self) -> None:
        """Block until every worker has started (and reported its state). What keeps one
        from starting is raised here; a failure of a worker that did start (heard of
        before another worker's start, on a busy machine) comes at its place in the
        order, after the batches before it."""
        ledger = self._book.view
        while ledger.starting():
            self._receive()
        if ledger.start_failed() and ledger.fatal is not None:
            raise ledger.fatal

    def _await_reports(self) -> None:
        """``state_dict()`` needs each worker's state at the start of the epoch."""
        while self.progress.unreported and not self.closed and self._book.view.fatal is None:
            self._receive()

    def _receive(self) -> None:
        """Block until a worker answers or dies, or a deadline passes; act on what came."""
        events = self._pool.wait(self._supervisor.wake_in())
        if not events:
            self._supervisor.check()
            return
        for event in events:
            if isinstance(event, Received):  # (no match: once a batch, commonest first)
                message = event.message
                if isinstance(message, (BatchDone, TaskFailed, IterationEnded)):
                    self._on_answer(event.worker_id, message, event.batch)
                else:
                    self._on_message(event.worker_id, message)
            elif isinstance(event, Died):
                self._supervisor.on_death(event)
            else:
                assert_never(event)

    def _on_message(self, worker_id: int, message: Any) -> None:
        """A worker's message other than a task's reply: it started, or could not."""
        match message:
            case Ready(state=state):
                self._book.on_ready(worker_id)
                self._supervisor.deadlines.started(time.monotonic())
                self.progress.began(worker_id, state)
            case StartupFailed():
                pid, remote = self._pid(worker_id), not self._config.kind.local
                error = failures.startup_failed(worker_id, message, pid, remote=remote)
                self._book.on_startup_failed(worker_id, error)
            case _:
                assert_never(message)

    def _on_answer(self, worker_id: int, message: TaskReply, batch: BatchHandle | None) -> None:
        """A task's reply (its batch, its failure, or its iterator's end): filed in the
        book, or freed when stale."""
        if message.epoch_state is not None:  # the first of the epoch
            self.progress.began(worker_id, message.epoch_state)
        ahead, book = self._run_ahead, self._book
        room = ahead(batch) if ahead is not None and batch is not None else None
        now, extra = time.monotonic(), book.ahead.extra
        filed = book.on_reply(worker_id, message, batch, now, room)
        if filed != FILED:
            # A batch of an epoch the user abandoned, or a suspect's verdict: just free
            # its slot.
            if batch is not None:
                batch.discard()
            if filed == SURVIVED:
                self._supervisor.judge.survived(message.seq)
            return
        if book.ahead.extra > extra:  # workers may run further ahead now
            self._top_up(now)
