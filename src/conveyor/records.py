"""What the loader reports about itself: frozen records, safe to keep and log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["InFlightTask", "LoaderStatistics", "SkippedSample", "WorkerStatistics"]


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out under ``on_error="skip"``, and why."""

    index: Any  # the dataset index
    epoch: int
    worker_id: int | None  # None: fetched in the main process (num_workers=0)
    # "fetch", "collate", "transfer"; "crash": it killed its worker (left out of later
    # epochs too); "killed": its worker was killed from outside (SIGKILL) each time it
    # was fetched, so it is likely the cause but not proven: tried again next epoch.
    stage: str
    exception_type: str  # e.g. "PIL.UnidentifiedImageError", or "WorkerCrashedError"
    message: str


@dataclass(frozen=True)
class InFlightTask:
    worker_id: int
    seq: int  # the batch's position in the epoch
    indices: tuple[Any, ...]
    age_s: float  # since it was sent to the worker


@dataclass(frozen=True)
class WorkerStatistics:
    worker_id: int
    pid: int | None
    batches: int
    samples: int
    restarts: int
    samples_per_s: float  # over this worker's lifetime in the current iterator


@dataclass(frozen=True)
class LoaderStatistics:
    """A snapshot from ``DataLoader.statistics()``."""

    epoch: int
    batches: int  # handed out in this epoch
    samples: int
    worker_restarts: int  # over the iterator's life (persistent workers: all epochs)
    tasks_retried: int
    samples_skipped: int
    in_flight: tuple[InFlightTask, ...]
    workers: tuple[WorkerStatistics, ...]
