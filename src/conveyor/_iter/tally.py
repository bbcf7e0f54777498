"""What reached the user and where the time went, as ``statistics()`` reports it, counted
alike by both iterators.

A batch is *delivered* when the user gets it (an error raised in its place, or a
batch every sample of which was left out, is not a batch delivered). The epoch's
counts start again with each epoch; each worker's, and the restarts, run over the
iterator's life. The stages' seconds (the workers' own account in each reply, the
main process's waits and decodes) go to a :class:`~conveyor.observe.timings.StageClock`,
and to the trace while one is recorded (``DataLoader.trace``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._task.protocol import BatchDone
from .._workers.api import BatchHandle, Usage
from ..config import LoaderHistory
from ..observe.timings import StageClock
from ..records import InFlightTask, LoaderStatistics, WorkerStatistics
from .batches import batch_size_of
from .ledger import BATCH, Entry, TaskRecord


@dataclass
class _WorkerTally:
    since: float
    batches: int = 0
    samples: int = 0
    restarts: int = 0


class Tally:
    def __init__(
        self,
        num_workers: int,
        now: float = 0.0,
        history: LoaderHistory | None = None,
        worker_method: str = "multiprocessing",
    ) -> None:
        self._workers = [_WorkerTally(now) for _ in range(num_workers)]
        self.batches = 0  # delivered this epoch
        self.samples = 0
        self.restarts = 0  # worker processes (or threads, actors) replaced
        self.retried = 0  # tasks re-sent to a replacement
        self.clock = StageClock(now, num_workers)
        self._history = history  # where a trace being recorded is (history.tracer)
        self._method = worker_method if num_workers else "none"
        self._cpu_from: list[float | None] = [None] * num_workers  # at the epoch's start
        # The workers' pids, for the trace's lanes (the loop sets it once it has a pool).
        self.pids: Callable[[], list[int | None]] = lambda: []

    def start_epoch(
        self, batches: int = 0, now: float | None = None, usage: Usage | None = None
    ) -> None:
        """``batches``: delivered before a resume (without workers, the statistics
        count those of the epoch the state was taken in)."""
        self.batches, self.samples = batches, 0
        self.clock.new_epoch(time.monotonic() if now is None else now)
        if usage is not None:
            self._cpu_from = [usage.active_s(i) for i in range(len(self._workers))]

    def add_worker(self, now: float, usage: Usage | None = None) -> None:
        self._workers.append(_WorkerTally(now))
        self.clock.add_worker()
        self._cpu_from.append(usage.active_s(len(self._workers) - 1) if usage else None)

    def worked(self, worker_id: int, reply: BatchDone, batch: BatchHandle | None) -> None:
        """A worker's account of its time on a task whose batch does not reach the user
        (every sample left out); one that does is counted as it is handed out."""
        nbytes = batch.nbytes if batch is not None else 0
        fetch, collate, send = reply.fetch_s, reply.collate_s, reply.encode_s
        self.clock.worked(worker_id, reply.busy_s, fetch, collate, send, nbytes)
        self._trace_worker(worker_id, reply)

    def _trace_worker(self, worker_id: int, reply: BatchDone) -> None:
        tracer = self._history.tracer if self._history is not None else None
        if tracer is not None and reply.started:
            pid = self._pid_of(worker_id)
            at, seq = reply.started, reply.seq
            fetch, collate, send = reply.fetch_s, reply.collate_s, reply.encode_s
            tracer.worker_span(worker_id, pid, "fetch", at, fetch, seq=seq)
            tracer.worker_span(worker_id, pid, "collate", at + fetch, collate, seq=seq)
            tracer.worker_span(worker_id, pid, "send", at + fetch + collate, send, seq=seq)

    def waited(self, began: float, ended: float) -> None:
        """The training loop waited inside ``next()`` from ``began`` to ``ended``."""
        self.clock.waited(ended - began)
        tracer = self._history.tracer if self._history is not None else None
        if tracer is not None:
            tracer.main_span("wait", began, ended - began)

    def in_process(self, began: float, fetch_s: float, collate_s: float) -> None:
        """Without workers: the loop fetched and collated a batch itself from ``began``."""
        self.clock.worked(-1, 0.0, fetch_s, collate_s, 0.0)
        tracer = self._history.tracer if self._history is not None else None
        if tracer is not None:
            tracer.main_span("fetch", began, fetch_s)
            tracer.main_span("collate", began + fetch_s, collate_s)

    def main_work(self, name: str, began: float, ended: float) -> float:
        """The main process rebuilt (``"decode"``) or pinned (``"pin"``) a batch; the
        seconds it took."""
        tracer = self._history.tracer if self._history is not None else None
        if tracer is not None:
            tracer.main_span(name, began, ended - began)
        return ended - began

    def _pid_of(self, worker_id: int) -> int | None:
        pids = self.pids()
        return pids[worker_id] if 0 <= worker_id < len(pids) else None

    def delivered(
        self, worker_id: int | None, samples: int, decode_s: float = 0.0, pin_s: float = 0.0
    ) -> None:
        """A batch of ``samples`` reached the user (``worker_id`` None: no workers)."""
        self.batches += 1
        self.samples += samples
        self.clock.handed_out(samples, decode_s, pin_s)
        if worker_id is not None:
            worker = self._workers[worker_id]
            worker.batches += 1
            worker.samples += samples

    def delivered_from(
        self, entry: Entry, batch: Any, decode_s: float = 0.0, pin_s: float = 0.0
    ) -> None:
        """The batch of ``entry``'s task reached the user. Its samples are counted from
        the task where it says (a batch of a map-style dataset's indices with none left
        out: inspecting a batch of tensors costs microseconds), else from the batch."""
        reply = entry.reply
        plain = entry.shape == BATCH and not entry.exclude and not entry.left_out
        if plain and isinstance(reply, BatchDone) and not reply.skipped:
            self.delivered(entry.worker_id, len(entry.index), decode_s, pin_s)
        else:
            self.delivered(entry.worker_id, batch_size_of(batch), decode_s, pin_s)

    def handed_out(
        self,
        entry: Entry,
        batch: Any,
        handle: BatchHandle,
        times: tuple[float, float, float, float],
        pin: bool,
    ) -> None:
        """The batch of ``entry``'s task reached the user from ``handle``, the one call a
        batch (its worker's account of its time is counted here too): asked for at
        ``times[0]`` (below 0: not by the user, a resumed epoch's replay), rebuilt from
        ``times[1]`` to ``times[2]``, then (``pin``) pinned until ``times[3]``."""
        asked, began, decoded, ended = times
        reply: BatchDone = entry.reply  # type: ignore[assignment]
        if entry.shape == BATCH and not entry.exclude and not entry.left_out and not reply.skipped:
            samples = len(entry.index)  # (see delivered_from)
        else:
            samples = batch_size_of(batch)
        self.batches += 1
        self.samples += samples
        worker_id = entry.worker_id
        worker = self._workers[worker_id]
        worker.batches += 1
        worker.samples += samples
        waited = ended - asked if asked >= 0 else 0.0
        decode_s, pin_s = decoded - began, ended - decoded
        self.clock.delivered(worker_id, reply, handle.nbytes, samples, decode_s, pin_s, waited)
        tracer = self._history.tracer if self._history is not None else None
        if tracer is not None:
            self._trace_worker(worker_id, reply)
            tracer.main_span("decode", began, decode_s)
            if pin:
                tracer.main_span("pin", decoded, pin_s)
            if asked >= 0:
                tracer.main_span("wait", asked, waited)

    def restarted(self, worker_id: int, retried: int, process: bool = True) -> None:
        """Worker ``worker_id`` was restarted, ``retried`` of its tasks re-sent.
        ``process``: its death is the death of its process (one per process: the cores
        of a process of threads die with it), counted in ``worker_restarts`` as
        ``max_worker_restarts`` charges it; each core counts its own restarts."""
        self._workers[worker_id].restarts += 1
        self.restarts += process
        self.retried += retried

    def statistics(
        self,
        epoch: int,
        *,
        skipped: int,
        now: float = 0.0,
        pids: list[int | None] | None = None,
        tasks: Iterable[TaskRecord] = (),
        usage: Usage | None = None,
    ) -> LoaderStatistics:
        """``tasks``: the task book's (those unanswered are in flight, those answered
        wait to be handed out); ``usage``: what the pool can say of its workers' CPU and
        memory, and how many batches hold their memory."""
        tasks = sorted(tasks, key=lambda e: e.seq)
        in_flight = tuple(
            InFlightTask(e.worker_id, e.seq, e.indices, now - e.sent_at)
            for e in tasks
            if e.reply is None
        )
        ready = [e for e in tasks if e.reply is not None]
        stages = self.clock.epoch(now)
        workers = tuple(
            WorkerStatistics(
                worker_id=i,
                pid=pids[i] if pids is not None else None,
                batches=w.batches,
                samples=w.samples,
                restarts=w.restarts,
                samples_per_s=w.samples / max(now - w.since, 1e-9),
                busy_share=self.clock.worker_busy[i] / stages.seconds if stages.seconds else 0.0,
                active_s=_reading(functools.partial(self._active_since, usage, i)),
                memory_bytes=_reading(functools.partial(_memory, usage, i)),
            )
            for i, w in enumerate(self._workers)
        )
        batches = [e.origin for e in ready if e.origin is not None]
        in_memory = _reading(lambda: usage.in_memory(batches)) if usage is not None else None
        return LoaderStatistics(
            stages=stages,
            stages_total=self.clock.total(now),
            ready=len(ready),
            slots_in_use=in_memory or 0,
            worker_method=self._method,
            epoch=epoch,
            batches=self.batches,
            samples=self.samples,
            worker_restarts=self.restarts,
            tasks_retried=self.retried,
            samples_skipped=skipped,
            in_flight=in_flight,
            workers=workers,
        )

    def _active_since(self, usage: Usage | None, worker_id: int) -> float | None:
        """A worker's seconds running or ready to run this epoch (None: unknown)."""
        if usage is None:
            return None
        now, since = usage.active_s(worker_id), self._cpu_from[worker_id]
        if now is None:
            return None
        return now - since if since is not None and since <= now else now


_T = TypeVar("_T")


def _memory(usage: Usage | None, worker_id: int) -> int | None:
    return usage.memory_bytes(worker_id) if usage is not None else None


def _reading(read: Callable[[], _T | None]) -> _T | None:
    """One reading of a worker's use, which may be replaced meanwhile (``statistics()``
    can be asked from any thread, at any moment): None, unknown, when it fails."""
    try:
        return read()
    except Exception:
        return None
