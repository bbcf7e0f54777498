"""What the loader reports about itself: frozen records, safe to keep and log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "InFlightTask",
    "LoaderStatistics",
    "SkippedSample",
    "StageTimes",
    "WorkerStatistics",
]


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out under ``on_error="skip"``, and why."""

    index: Any  #: the dataset index
    epoch: int  #: the epoch it was left out of
    worker_id: int | None  #: None: fetched in the main process (num_workers=0)
    #: "fetch", "collate", "transfer"; "crash": it killed its worker (left out of later
    #: epochs too); "killed": its worker was killed from outside (SIGKILL) each time it
    #: was fetched, so it is likely the cause but not proven: tried again next epoch.
    stage: str
    exception_type: str  #: e.g. "PIL.UnidentifiedImageError", or "WorkerCrashedError"
    message: str  #: the exception's message (or the crash's report)


@dataclass(frozen=True)
class InFlightTask:
    """A batch a worker is making now (``LoaderStatistics.in_flight``)."""

    worker_id: int  #: the worker making it
    seq: int  #: the batch's position in the epoch
    indices: tuple[Any, ...]  #: its dataset indices
    age_s: float  #: seconds since it was sent to the worker


@dataclass(frozen=True)
class WorkerStatistics:
    """One worker's figures (``LoaderStatistics.workers``)."""

    worker_id: int  #: the worker's id, as ``get_worker_info().id`` says it
    pid: int | None  #: its process (None: its kind cannot say)
    batches: int  #: batches it made in the current iterator
    samples: int  #: samples it fetched in the current iterator
    #: Times this worker was restarted: a worker in a process of threads
    #: (threads_per_worker) is restarted with its process, whichever core's doing it was.
    restarts: int
    samples_per_s: float  #: over this worker's lifetime in the current iterator
    busy_share: float = 0.0  #: of the epoch's wall time, the share it spent on tasks
    #: This epoch, the seconds it was running or ready to run (on a CPU or waiting for one);
    #: the rest of its busy time it waited on something else, I/O (None: cannot say).
    active_s: float | None = None
    memory_bytes: int | None = None  #: its own memory (USS; None: its kind cannot say)


@dataclass(frozen=True)
class StageTimes:
    """Where the time of an epoch (or of the loader's whole life) went, in seconds.

    Workers' stages are summed over workers (with 4 workers busy for the whole of a
    10 s epoch, ``busy_s`` is 40). The main process's are its own: decoding batches,
    pinning them, and the training loop waiting inside ``next()``.
    """

    seconds: float = 0.0  #: wall time
    batches: int = 0  #: batches handed out
    samples: int = 0  #: samples in them
    fetch_s: float = 0.0  #: __getitem__ / __getitems__ / next(iterator), in workers
    collate_s: float = 0.0  #: collate_fn, in workers
    send_s: float = 0.0  #: encoding the batch for its way back, in workers
    busy_s: float = 0.0  #: workers' whole time on tasks
    decode_s: float = 0.0  #: rebuilding batches in the main process
    pin_s: float = 0.0  #: pin_memory, in the main process
    wait_s: float = 0.0  #: the training loop inside next() (rebuilding and pinning included)
    bytes: int = 0  #: batch bytes moved from workers

    @property
    def samples_per_s(self) -> float:
        """Samples handed out per second of wall time."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """The share of the wall time the training loop spent waiting for data."""
        return self.wait_s / self.seconds if self.seconds > 0 else 0.0

    def per_batch(self, seconds: float) -> float:
        """``seconds`` (one of the stage times) per batch handed out."""
        return seconds / self.batches if self.batches else 0.0

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """``{prefix + name: number}``: the counts, rates, and each stage in ms a batch."""
        out: dict[str, float] = {
            f"{prefix}seconds": self.seconds,
            f"{prefix}batches": self.batches,
            f"{prefix}samples": self.samples,
            f"{prefix}samples_per_s": self.samples_per_s,
            f"{prefix}wait_share": self.wait_share,
        }
        for name in ("fetch", "collate", "send", "busy", "decode", "pin", "wait"):
            out[f"{prefix}{name}_ms_per_batch"] = 1000 * self.per_batch(getattr(self, f"{name}_s"))
        out[f"{prefix}bytes"] = self.bytes
        return out


@dataclass(frozen=True)
class LoaderStatistics:
    """A snapshot from ``DataLoader.statistics()``.

    ``as_dict()`` flattens it into ``{name: number}``, ready for Lightning's
    ``self.log_dict(...)`` or a TensorBoard writer: ``epoch/...`` for the current
    epoch, ``total/...`` since the loader started.
    """

    epoch: int  #: the current (or last) epoch, from 0
    batches: int  #: handed out in this epoch
    samples: int  #: in those batches
    #: Worker deaths replaced, one per process that died (its cores die with it: see
    #: WorkerStatistics.restarts), over the iterator's life (persistent workers: all
    #: epochs); max_worker_restarts counts the same deaths, bar those proven to be a
    #: sample's doing under on_error="skip" (max_errors pays for those).
    worker_restarts: int
    tasks_retried: int  #: tasks (batches) re-sent to a replacement worker
    samples_skipped: int  #: left out under on_error="skip" (see DataLoader.skipped_samples)
    in_flight: tuple[InFlightTask, ...]  #: the batches workers are making now
    workers: tuple[WorkerStatistics, ...]  #: each worker's figures
    stages: StageTimes = StageTimes()  #: this epoch
    stages_total: StageTimes = StageTimes()  #: since the loader's first epoch
    ready: int = 0  #: batches arrived and not taken yet (the queue's depth)
    slots_in_use: int = 0  #: shared-memory slots holding batches now (process workers)
    worker_method: str = "multiprocessing"  #: or "thread", "ray"; num_workers=0: "none"
    notes: tuple[str, ...] = ()  #: what num_workers="auto" chose and why, and the like
    #: num_workers="auto": seconds from the first batch until the count stopped changing
    #: (None: not settled yet, or a fixed count).
    settled_after_s: float | None = None
    auto_workers: int | None = None  #: num_workers="auto": how many serve now

    def as_dict(self) -> dict[str, float]:
        """Flat ``{name: number}`` (see the class's description): the counts, the mean
        ``worker_busy_share``, and ``epoch/...`` and ``total/...`` from the stage times."""
        out: dict[str, float] = {
            "epoch": self.epoch,
            "workers": len(self.workers),
            "worker_restarts": self.worker_restarts,
            "tasks_retried": self.tasks_retried,
            "samples_skipped": self.samples_skipped,
            "in_flight": len(self.in_flight),
            "ready": self.ready,
            "slots_in_use": self.slots_in_use,
        }
        if self.auto_workers is not None:
            out["auto_workers"] = self.auto_workers
        if self.settled_after_s is not None:
            out["auto_settled_after_s"] = self.settled_after_s
        if self.workers:
            out["worker_busy_share"] = sum(w.busy_share for w in self.workers) / len(self.workers)
        out.update(self.stages.as_dict("epoch/"))
        out.update(self.stages_total.as_dict("total/"))
        return out
