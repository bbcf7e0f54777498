"""Stalls and timeouts, measured on the workers' status pages.

A mixin of MultiprocessIterator: it turns the nearest deadline into the
timeout of the iterator's ``wait()`` (no polling) and acts when one passes.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING

from .._workers.pool import Worker
from .._workers.status import WorkerStatus, read_status
from ..errors import (
    WorkerStallWarning,
    WorkerTimeoutError,
)
from .tasks import IteratorState, indices_of, short

STALL_FACTOR = 10  # a task is stalled past this many typical batch times...


class Watchdog(IteratorState):
    """Reports stalled tasks with the worker's stack; enforces ``timeout``."""

    if TYPE_CHECKING:

        def _recover(self, worker: Worker) -> None: ...

    def _running(self) -> list[tuple[Worker, WorkerStatus]]:
        statuses = [(w, read_status(w.arena.status_page)) for w in self._workers]
        return [(w, s) for w, s in statuses if s.stage is not None]

    def _next_wake(self) -> float | None:
        """Seconds until a running task may reach the timeout or stall threshold.

        Reading the status pages costs a little, so it is done only once the
        previous answer has run out: a task that starts later cannot reach a
        limit before ``now + min(limits)``, which bounds every answer.
        """
        limits = [x for x in (self._timeout or None, self._stall_threshold()) if x]
        if not limits:
            return None
        now = time.monotonic()
        if now < self._recheck_at:
            return self._recheck_at - now
        wakes = [min(limits)]
        for _, status in self._running():
            wakes += [limit - status.age_s for limit in limits]
        self._recheck_at = now + max(0.0, min(wakes))
        return self._recheck_at - now

    def _typical_batch_time(self) -> str:
        if not self._batch_time:
            return "no typical batch time is known yet"
        return f"batches usually take {self._batch_time * 1000:.3g} ms"

    def _stall_threshold(self) -> float | None:
        if self._policy.stall_warning is None:
            return None
        return max(self._policy.stall_warning, STALL_FACTOR * self._batch_time)

    # --- stalls and timeouts --------------------------------------------

    def _report_stalls(self) -> None:
        threshold = self._stall_threshold()
        if threshold is None:
            return
        for worker, status in self._running():
            task = self._outstanding.get(status.seq)
            if status.age_s < threshold or status.epoch != self._epoch or task is None:
                continue
            if task.stall_reported or task.worker_id != worker.worker_id:
                continue
            task.stall_reported = True
            assert status.stage is not None
            warnings.warn(
                f"DataLoader worker {worker.worker_id} (pid {worker.pid}) has spent "
                f"{status.age_s:.0f} s on batch {status.seq} (dataset indices "
                f"{short(indices_of(task.index, self._iterable))}), in stage "
                f"{status.stage.value}; {self._typical_batch_time()}. "
                "It may be stuck (a dead network mount, a lock, an endless loop). Its "
                f"current Python stack:\n{self._pool.dump_stacks(worker) or '(unavailable)'}",
                WorkerStallWarning,
                stacklevel=5,
            )

    def _check_timeout(self) -> bool:
        """Handle a worker busy past ``timeout``; True if one was found."""
        if not self._timeout:
            return False
        stuck = [(w, s) for w, s in self._running() if s.age_s >= self._timeout]
        if not stuck:
            return False
        worker, status = max(stuck, key=lambda ws: ws[1].age_s)
        assert status.stage is not None
        task = self._outstanding.get(status.seq) if status.epoch == self._epoch else None
        indices = indices_of(task.index, self._iterable) if task is not None else ()
        doing = f"batch {status.seq} (dataset indices {short(indices)})" if task else "start-up"
        stacks = self._pool.dump_stacks(worker)
        if self._policy.on_timeout == "restart":
            self._killed_stuck[worker.worker_id] = (
                f"stuck for {status.age_s:.1f} s in {status.stage.value}, past "
                f"timeout={self._timeout}, so conveyor killed it"
                + (f"; its Python stack then:\n{stacks}" if stacks else "")
            )
            self._pool.kill(worker)
            worker.process.join()
            self._recover(worker)
            return True
        self._pool.kill(worker)  # known stuck: teardown need not wait for it to stop
        raise WorkerTimeoutError(
            f"DataLoader timed out after {self._timeout} seconds: worker {worker.worker_id} "
            f"(pid {worker.pid}) has been on {doing} for {status.age_s:.1f} s, in stage "
            f"{status.stage.value}. Fix: find what blocks it (a slow disk or network read, a "
            "lock), raise timeout, or pass on_timeout='restart' to kill the stuck worker "
            "and retry." + (f"\nThe worker's current Python stack:\n{stacks}" if stacks else ""),
            worker_id=worker.worker_id,
            pid=worker.pid,
            indices=indices,
        )
