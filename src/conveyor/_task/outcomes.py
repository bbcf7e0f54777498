"""What running a task comes to: one value per outcome, and who is told along the way.

:class:`~conveyor._task.runner.TaskRunner` raises nothing from user code: every task ends as
one of :data:`TaskOutcome`'s values (a batch, nothing left, a failure, the end of an
iterable dataset's stream), which the worker core and the inline iterator act on. A
:class:`Watcher` (a worker's status page) is told the stage and, on a traced retry, the
sample. Kept apart from the runner so that its streamed fetch (``_task/stream.py``)
speaks the same values without importing the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from conveyor._task.fetch import StopCheck
from conveyor._task.protocol import Stage
from conveyor.errors import CollateError, Culprit

__all__ = [
    "UNWATCHED",
    "Abandoned",
    "Collated",
    "Exhausted",
    "Failed",
    "LeftOut",
    "NothingLeft",
    "TaskOutcome",
    "Watcher",
    "batch_failed",
]


class Watcher(Protocol):
    """Told where the runner is: its stage, and on a traced retry which sample (a
    worker's status page watches); asked, before each sample, whether the worker has
    been told to stop."""

    def stage(self, stage: Stage) -> None: ...

    def position(self, position: int) -> None: ...

    # Asked before each sample: a C-level callable (a bound read of the status page's
    # field), since it runs once a sample; None for a worker never stopped mid-batch.
    @property
    def stop_check(self) -> StopCheck | None: ...


class _Unwatched:
    stop_check = None

    def stage(self, stage: Stage) -> None:
        pass

    def position(self, position: int) -> None:
        pass


UNWATCHED: Watcher = _Unwatched()


@dataclass(frozen=True)
class LeftOut:
    """A sample left out of its batch under ``on_error="skip"``."""

    index: Any
    stage: Stage
    error: BaseException


@dataclass(frozen=True)
class Collated:
    batch: Any
    indices: list[Any] | None  # dataset indices in the batch; None for iterable datasets
    left_out: tuple[LeftOut, ...] = ()


@dataclass(frozen=True)
class NothingLeft:
    """Every sample of the batch was left out (or excluded up front)."""

    left_out: tuple[LeftOut, ...] = ()


@dataclass(frozen=True)
class Failed:
    stage: Stage
    error: BaseException
    culprit: Culprit | None = None  # the sample that raised, where known


@dataclass(frozen=True)
class Exhausted:
    """An iterable-style dataset's iterator can give no further batch this epoch."""


@dataclass(frozen=True)
class Abandoned:
    """The worker was told to stop (the interpreter's exit, teardown) between two samples:
    the batch it was building is dropped, and nothing answers the task."""


TaskOutcome = Collated | NothingLeft | Failed | Exhausted | Abandoned


def batch_failed(
    stage: Stage,
    error: Exception,
    indices: list[Any] | None,
    left_out: tuple[LeftOut, ...] = (),
    *,
    skip_errors: bool,
) -> NothingLeft | Failed:
    """A batch failed after fetching (collate, transfer): under ``"skip"`` each
    of its samples is left out with the error; otherwise the task fails."""
    if skip_errors and indices:
        return NothingLeft((*left_out, *(LeftOut(i, stage, error) for i in indices)))
    # default_collate names the samples at fault when only some are (a missing key).
    culprits = error.culprits if isinstance(error, CollateError) else ()
    return Failed(stage, error, Culprit(culprits) if culprits else None)
