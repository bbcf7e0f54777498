"""The exceptions raised for what failed in a worker, built from the facts.

The user's own exception keeps its type (``except KeyError`` still works): it is
rebuilt here and carries its context — worker, pid, stage, the batch and its dataset
indices, the sample that raised where the worker could tell, the worker's traceback —
as a note (see ``errors.attach_worker_context``). Where
there is no exception of the user's, conveyor's says what happened.
"""

from __future__ import annotations

from typing import Any

from .._task.protocol import Stage, StartupFailed, TaskFailed
from .._task.rebuild import rebuild
from ..errors import (
    Culprit,
    WorkerContext,
    WorkerStartupError,
    add_note,
    attach_worker_context,
)
from . import messages


class TaskError(Exception):
    """Carries an exception from user code out of the loop's hand-out path to the
    iterator's ``__next__``, which raises it and goes on (torch consumes a failed batch)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def task_failed(
    reply: TaskFailed, worker_id: int, pid: int | None, indices: tuple[Any, ...]
) -> BaseException:
    """The exception user code raised in a worker, for that task's turn."""
    context = WorkerContext(
        worker_id=worker_id,
        pid=pid or -1,
        stage=reply.stage.value,
        indices=indices,
        traceback=reply.error.traceback,
        epoch=reply.epoch,
        seq=reply.seq,
        culprit=reply.culprit,
    )
    return attach_worker_context(rebuild(reply.error), context)


def raised_here(
    error: BaseException,
    stage: Stage,
    indices: tuple[Any, ...],
    epoch: int,
    seq: int,
    culprit: Culprit | None,
) -> BaseException:
    """The exception user code raised in the training thread (``num_workers=0``), itself,
    with the note a worker's would have, less the worker."""
    context = WorkerContext(
        worker_id=None,
        pid=None,
        stage=stage.value,
        indices=indices,
        epoch=epoch,
        seq=seq,
        culprit=culprit,
    )
    return attach_worker_context(error, context)


def undecodable(
    exc: BaseException,
    worker_id: int,
    pid: int | None,
    indices: tuple[Any, ...],
    epoch: int,
    seq: int,
) -> BaseException:
    """A batch pickled in its worker and does not unpickle here (a class missing in
    this process, a ``__setstate__`` that raises): that batch's error, like one
    raised in ``__getitem__``."""
    context = WorkerContext(
        worker_id=worker_id,
        pid=pid or -1,
        stage=Stage.DECODE.value,
        indices=indices,
        epoch=epoch,
        seq=seq,
    )
    add_note(exc, messages.DECODE_FAILED)
    return attach_worker_context(exc, context)


def startup_failed(
    worker_id: int, failed: StartupFailed, pid: int | None, *, remote: bool = False
) -> BaseException:
    """A worker could not start. The user's ``worker_init_fn`` (WORKER_INIT) and
    restoring the dataset's state (FETCH) raise their own exception; anything else is
    a WorkerStartupError (``remote``: a Ray worker's)."""
    exc = rebuild(failed.error)
    context = WorkerContext(
        worker_id=worker_id,
        pid=pid or -1,
        stage=failed.stage.value,
        traceback=failed.error.traceback,
    )
    if failed.stage not in (Stage.WORKER_INIT, Stage.FETCH):
        error = WorkerStartupError(messages.startup_failed(worker_id, pid, exc, remote=remote))
        error.__cause__ = exc
        exc = error
    return attach_worker_context(exc, context)
