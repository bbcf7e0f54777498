"""What reached the user, as ``statistics()`` reports it, counted alike by both iterators.

A batch is *delivered* when the user gets it (an error raised in its place, or a
batch every sample of which was left out, is not a batch delivered). The epoch's
counts start again with each epoch; each worker's, and the restarts, run over the
iterator's life.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._workers.protocol import BatchDone
from ..records import InFlightTask, LoaderStatistics, WorkerStatistics
from .batches import batch_size_of
from .book import BATCH, Entry


@dataclass
class _WorkerTally:
    since: float
    batches: int = 0
    samples: int = 0
    restarts: int = 0


class Tally:
    def __init__(self, num_workers: int, now: float = 0.0) -> None:
        self._workers = [_WorkerTally(now) for _ in range(num_workers)]
        self.batches = 0  # delivered this epoch
        self.samples = 0
        self.restarts = 0  # workers replaced
        self.retried = 0  # tasks re-sent to a replacement

    def start_epoch(self, batches: int = 0) -> None:
        """``batches``: delivered before a resume (without workers, the statistics
        count those of the epoch the state was taken in)."""
        self.batches, self.samples = batches, 0

    def delivered(self, worker_id: int | None, samples: int) -> None:
        """A batch of ``samples`` reached the user (``worker_id`` None: no workers)."""
        self.batches += 1
        self.samples += samples
        if worker_id is not None:
            worker = self._workers[worker_id]
            worker.batches += 1
            worker.samples += samples

    def delivered_from(self, entry: Entry, batch: Any) -> None:
        """The batch of ``entry``'s task reached the user. Its samples are counted from
        the task where it says (a batch of a map-style dataset's indices with none left
        out: inspecting a batch of tensors costs microseconds), else from the batch."""
        reply = entry.reply
        plain = entry.shape == BATCH and not entry.exclude and not entry.left_out
        if plain and isinstance(reply, BatchDone) and not reply.skipped:
            self.delivered(entry.worker_id, len(entry.index))
        else:
            self.delivered(entry.worker_id, batch_size_of(batch))

    def restarted(self, worker_id: int, retried: int) -> None:
        self._workers[worker_id].restarts += 1
        self.restarts += 1
        self.retried += retried

    def statistics(
        self,
        epoch: int,
        *,
        skipped: int,
        now: float = 0.0,
        pids: list[int | None] | None = None,
        tasks: Iterable[Entry] = (),
    ) -> LoaderStatistics:
        """``tasks``: the task book's (those unanswered are in flight)."""
        in_flight = tuple(
            InFlightTask(e.worker_id, e.seq, e.indices, now - e.sent_at)
            for e in sorted(tasks, key=lambda e: e.seq)
            if e.reply is None
        )
        workers = tuple(
            WorkerStatistics(
                worker_id=i,
                pid=pids[i] if pids is not None else None,
                batches=w.batches,
                samples=w.samples,
                restarts=w.restarts,
                samples_per_s=w.samples / max(now - w.since, 1e-9),
            )
            for i, w in enumerate(self._workers)
        )
        return LoaderStatistics(
            epoch=epoch,
            batches=self.batches,
            samples=self.samples,
            worker_restarts=self.restarts,
            tasks_retried=self.retried,
            samples_skipped=skipped,
            in_flight=in_flight,
            workers=workers,
        )
