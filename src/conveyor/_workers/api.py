"""The pool protocol: what the loop needs of its workers, whatever kind they are.

Four verbs — :meth:`Pool.send`, :meth:`Pool.wait`, :meth:`Pool.restart`,
:meth:`Pool.close` — and two events, :class:`Received` and :class:`Died`. What only
some kinds of worker can do is declared in :class:`Abilities` and asked for by the
loop: read what a worker is doing and dump its stacks (``inspect``), kill a stuck one
(``kill``) or, where it cannot be killed (a thread), abandon it (``abandon``), tell how
far its workers may run ahead (``run_ahead``), show its processes the way torch's
iterator does (``handles``).

A received batch travels as a :class:`BatchHandle`: the loop opens it when the batch
is handed out, or discards it, without knowing how it came (shared memory, a
reference from a thread, an object store). How a kind's workers hold memory (the
process pool's slots, their release, their budget) is that kind's own business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._task.protocol import (
    Died,
    EpochMessage,
    RoomAhead,
    Task,
    WorkerMessage,
    WorkerStatus,
)
from .spec import UserObjects, WorkerSpec

__all__ = [
    "Abandoner",
    "Abilities",
    "BatchHandle",
    "Died",
    "Inspector",
    "Pool",
    "PoolEvent",
    "PoolFactory",
    "Received",
    "Resizer",
    "Usage",
]


class BatchHandle(Protocol):
    """A batch as it arrived, not yet rebuilt."""

    def open(self) -> Any:
        """The batch (arrays are views of the transport's memory where it has any)."""
        ...

    def discard(self) -> None:
        """Give its memory back without rebuilding it (an abandoned epoch)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes it crossed the transport with (0: handed over by reference)."""
        ...


@dataclass(frozen=True)
class Received:
    """A message from a worker; ``batch`` is a task's batch, when it has one (see
    :class:`BatchHandle`: opened when handed out, even after its worker was replaced)."""

    worker_id: int
    message: WorkerMessage
    batch: BatchHandle | None = None


PoolEvent = Received | Died  # what Pool.wait reports: a worker's message, or its death


class Inspector(Protocol):
    """Seeing into running workers."""

    def pids(self) -> list[int | None]: ...

    def status(self, worker_id: int) -> WorkerStatus:
        """What the worker is doing right now (task, stage, for how long)."""
        ...

    def stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        """Its current Python stacks, or "" if it can't say."""
        ...


class Usage(Protocol):
    """What running workers use (statistics and the verdict)."""

    def active_s(self, worker_id: int) -> float | None:
        """Seconds the worker has been running or ready to run (on a CPU, or waiting for
        one) so far; the rest of its busy time it waited on I/O (None: unknown)."""
        ...

    def memory_bytes(self, worker_id: int) -> int | None:
        """Memory the worker alone holds (USS; None: unknown, or shared with others)."""
        ...

    def in_memory(self, batches: Iterable[BatchHandle]) -> int:
        """Batches that hold its workers' memory: of ``batches`` (received, waiting to be
        handed out), and those handed out and not yet garbage."""
        ...


class Resizer(Protocol):
    """More or fewer workers while they run (``num_workers="auto"``)."""

    def add(self, spec: WorkerSpec) -> None:
        """Start one more worker; ``spec.worker_id`` is the next id."""
        ...

    def retire(self, worker_id: int) -> None:
        """Stop a worker that has no task left, for good."""
        ...


class Abandoner(Protocol):
    """Stuck workers that cannot be killed (threads): left to themselves."""

    def abandon(self, worker_id: int) -> None:
        """Stop using a stuck worker, for good: it runs no other task, is never waited
        for, and ends by itself if its task ever returns. A Died follows; it reads as
        gone (idle) until it is replaced."""
        ...

    def no_replacement(self) -> str | None:
        """Why a stuck worker may not be abandoned and replaced now (too many abandoned
        ones are still stuck), in words; None: it may."""
        ...


@dataclass(frozen=True)
class Abilities:
    """What a kind of worker can do beyond the four verbs (None: it can't)."""

    inspect: Inspector | None = None
    # End a stuck worker: a Died follows, and until it is replaced it reads as gone.
    kill: Callable[[int], None] | None = None
    abandon: Abandoner | None = None  # where it cannot be killed: leave it to itself
    # How far its workers may run ahead, judged from a batch received (None: it says
    # nothing; processes: from their slots, see _iter/run_ahead.py).
    run_ahead: Callable[[BatchHandle], RoomAhead | None] | None = None
    handles: Callable[[], list[Any]] | None = None  # for code that reads iterator._workers
    usage: Usage | None = None  # their CPU time and memory
    resize: Resizer | None = None  # more or fewer of them as they run


class Pool(Protocol):
    @property
    def num_workers(self) -> int: ...

    @property
    def abilities(self) -> Abilities: ...

    def send(self, worker_id: int, message: Task | EpochMessage) -> None:
        """Never blocks. To a worker that just died a task is lost: the loop re-sends
        what a dead worker had not answered. What an epoch starts with (ReplayCalls,
        SeedPipe) is kept for its replacement too (``WorkerSpec.keeping``)."""
        ...

    def wait(self, timeout: float | None) -> list[PoolEvent]:
        """Block until a worker answers or dies, or ``timeout`` passes ([])."""
        ...

    def restart(self, worker_id: int) -> None:
        """A fresh worker in place of a dead (or killed) one: same id, same seed."""
        ...

    def close(self) -> None:
        """Stop every worker for sure; safe to call twice."""
        ...


class PoolFactory(Protocol):
    """Starts a kind's workers (its settings bound by its ``WorkerKind.pool``)."""

    def __call__(self, user: UserObjects, specs: Sequence[WorkerSpec]) -> Pool: ...
