"""The loop's hands for ``num_workers="auto"``: measure a window, ask, act.

The policy is :class:`~conveyor.observe.autotune.Autotuner` (pure). This applies its
decisions: a worker added starts with the next id and the same base seed as the
others (each worker's seed is the base plus its id, as torch's); a worker retired gets
no task again, answers those it has, and is stopped once they are all handed out.
Batches and their order never depend on how many workers there are (the task book
orders them), and with ``reseed`` neither do augmentations.
"""

from __future__ import annotations

import dataclasses
import time

from .._workers.api import Pool
from .._workers.spec import WorkerSpec
from ..diagnostics.environment import available_memory
from ..observe import failsafe
from ..observe.autotune import Autotuner
from ..observe.progress import logger
from .book import TaskBook
from .tally import Tally

TUNER = "num_workers='auto' autotuner"  # its name for failsafe.py


class WorkerCount:
    def __init__(
        self,
        tuner: Autotuner,
        book: TaskBook,
        pool: Pool,
        tally: Tally,
        specs: list[WorkerSpec],
    ) -> None:
        self._tuner, self._book, self._pool, self._tally = tuner, book, pool, tally
        self._specs = specs
        self._window = tally.clock.mark(time.monotonic())
        self._active_from = self._active()
        self._leaving: set[int] = set()  # retired, still answering their tasks
        self._started = time.monotonic()
        # Seconds from the start to the window that settled the count (None: not settled).
        self.settled_after_s: float | None = None

    @property
    def notes(self) -> tuple[str, ...]:
        notes = [f"{count} workers: {why}" for count, why in self._tuner.history]
        if self._tuner.held_back is not None:
            notes.append(self._tuner.held_back)
        if self.settled_after_s is not None:
            notes.append(
                f"settled at {self._book.serving} worker{'' if self._book.serving == 1 else 's'} "
                f"after {self.settled_after_s:.1f} s (no change for the last windows)"
            )
        return tuple(notes)

    def after_batch(self) -> None:
        """A batch was handed out: stop drained workers, and decide at a window's end. A
        failure of the tuner's own is logged once and the count it has is kept: it never
        ends the training run (observe/failsafe.py)."""
        failsafe.guarded(TUNER, self._after_batch)

    def _after_batch(self) -> None:
        for worker_id in [w for w in self._leaving if self._book.drained(w)]:
            self._leaving.discard(worker_id)
            resize = self._pool.abilities.resize
            if resize is not None:
                resize.retire(worker_id)
        now = time.monotonic()
        window = self._tally.clock.since(self._window, now)
        if not self._tuner.window_done(window):
            return
        self._window = self._tally.clock.mark(now)
        active, before = self._active(), self._active_from
        self._active_from = active
        usage = self._pool.abilities.usage
        memory = max(
            (m for i in range(self._book.num_workers) if usage and (m := usage.memory_bytes(i))),
            default=None,
        )
        since = active - before if active is not None and before is not None else None
        decision = self._tuner.decide(
            window, self._book.serving, memory, available_memory()[0], since
        )
        for _ in range(decision.change):
            self._add(now)
        if decision.change < 0:
            self._retire()
        if decision.change:
            self.settled_after_s = None
            logger.info("num_workers='auto': %s", decision.why)
        elif self._tuner.settled and self.settled_after_s is None:
            self.settled_after_s = now - self._started

    def _active(self) -> float | None:
        """The workers' seconds running or runnable so far (None: their kind can't say)."""
        usage = self._pool.abilities.usage
        if usage is None:
            return None
        book = self._book
        serving = [i for i in range(book.num_workers) if not book.retired(i)]
        seconds = [usage.active_s(i) for i in serving]
        return None if any(s is None for s in seconds) else sum(s or 0.0 for s in seconds)

    def _add(self, now: float) -> None:
        resize = self._pool.abilities.resize
        if resize is None:
            return
        worker_id = self._book.num_workers
        spec = dataclasses.replace(self._specs[0], worker_id=worker_id, num_workers=worker_id + 1)
        resize.add(spec)  # first: a start that fails leaves the book as it was
        self._book.add_worker()
        self._specs.append(spec)
        self._tally.add_worker(now, self._pool.abilities.usage)

    def _retire(self) -> None:
        book = self._book
        serving = [i for i in range(book.num_workers) if not book.retired(i)]
        worker_id = serving[-1]  # the last added goes first
        self._book.retire_worker(worker_id)
        self._leaving.add(worker_id)
