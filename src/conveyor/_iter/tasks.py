"""What the multi-process iterator keeps about each task and worker, and small helpers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .._workers.pool import Worker, WorkerPool
from .._workers.protocol import BatchDone, IterationEnded, TaskFailed
from .policy import SupervisionPolicy
from .skips import SkipLedger


class UserError(Exception):
    """Carries an exception from user code out of _next_batch (see __next__)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass
class Outstanding:
    worker_id: int
    index: Any
    sent_at: float
    crashes: int = 0
    exclude: tuple[Any, ...] = ()
    stall_reported: bool = False
    timed: bool = True  # its worker was up when it was sent: its duration is typical


@dataclass
class Done:
    message: BatchDone | TaskFailed | IterationEnded
    worker: Worker  # the worker that produced it (maybe replaced since)


@dataclass
class WorkerCounters:
    batches: int = 0
    samples: int = 0
    restarts: int = 0
    init_crashes: int = 0
    since: float = field(default_factory=time.monotonic)


class IteratorState:
    """The state MultiprocessIterator keeps, declared for its mixins (Recovery,
    Watchdog) so the type checker knows what they may use."""

    _epoch: int
    _iterable: bool
    _timeout: float
    _policy: SupervisionPolicy
    _pool: WorkerPool
    _workers: list[Worker]
    _outstanding: dict[int, Outstanding]
    _results: dict[int, Done]
    _counters: list[WorkerCounters]
    _skips: SkipLedger
    _restarts: int
    _retried: int
    _killed_stuck: dict[int, str]
    _batch_time: float
    _recheck_at: float


def indices_of(index: Any, iterable: bool) -> tuple[Any, ...]:
    if iterable:
        return ()
    return tuple(index) if isinstance(index, (list, tuple)) else (index,)


def batch_size_of(batch: Any) -> int:
    """Samples in a collated batch, best effort (for statistics only)."""
    node = batch
    for _ in range(8):
        shape = getattr(node, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
        if isinstance(node, dict) and node:
            node = next(iter(node.values()))
        elif isinstance(node, (list, tuple)) and node:
            if isinstance(node[0], (str, bytes, int, float)):
                return len(node)
            node = node[0]
        else:
            break
    return 1


def short(indices: tuple[Any, ...], limit: int = 16) -> str:
    shown = ", ".join(repr(i) for i in indices[:limit])
    return f"[{shown}{', ...' if len(indices) > limit else ''}]"
