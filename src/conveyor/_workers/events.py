"""What ``WorkerPool.wait`` reports: a worker's message, or its death, as values.

Kept apart from the pool so the task book can take a death as a fact without
importing the pool's process machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .protocol import WorkerMessage
from .status import WorkerStatus


@dataclass(frozen=True)
class Received:
    """A message from a worker. ``origin`` is the process that sent it: decode its
    payload with ``WorkerPool.decode`` even after that worker was replaced."""

    worker_id: int
    message: WorkerMessage
    origin: Any


@dataclass(frozen=True)
class Died:
    """A worker process exited without being asked to (its messages came first)."""

    worker_id: int
    pid: int | None
    exitcode: int | None
    status: WorkerStatus  # its status page, read after it died


PoolEvent = Received | Died
