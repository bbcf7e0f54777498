"""What ``Pool.wait`` reports: a worker's message, or its death, as values.

Kept apart from the pools so the task book can take a death as a fact without
importing any worker machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .protocol import WorkerMessage
from .status import WorkerStatus

if TYPE_CHECKING:
    from .api import BatchHandle


@dataclass(frozen=True)
class Received:
    """A message from a worker; ``batch`` is a task's batch, when it has one (see
    ``api.BatchHandle``: opened when handed out, even after its worker was replaced)."""

    worker_id: int
    message: WorkerMessage
    batch: BatchHandle | None = None


@dataclass(frozen=True)
class Died:
    """A worker exited without being asked to (its messages came first).

    ``exitcode`` None: how it ended is not known (a Ray actor's process: Ray does not say
    whether it crashed or was killed), which is weak evidence against its sample, as a
    kill from outside is. ``cause`` then says what is known, in words.

    A bystander (a core whose process died of a sibling core's doing) is no evidence
    against what it ran: its tasks are simply sent again."""

    worker_id: int
    pid: int | None
    exitcode: int | None
    status: WorkerStatus  # what it was doing, read after it died
    cause: str | None = None
    # Cores in threads of one process (threads_per_worker): its death ended them all.
    shared_with: tuple[int, ...] = ()  # the other cores of its process
    bystander: int | None = None  # the core whose doing the death was, when not this one
    charged: bool = True  # counts against max_worker_restarts: once per process death


PoolEvent = Received | Died
