"""The worker process: receive tasks, fetch, collate, send the batch back.

Workers are stateless executors of tasks (an iterable-style dataset's iterator
aside). Every exception raised by user code is caught here with the stage it
happened in and sent back; the main process decides what to do.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import pickle
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np

from .. import _torch
from .._iter.fetch import IterableFetcher, MapFetcher, as_list
from .._transport.arena import WorkerArena
from .._transport.codec import Encoder
from ..collate import collate_context, default_collate, default_convert, make_tensors_in_main
from ..resources import close_all as close_per_worker_resources
from ..worker_info import WorkerInfo, set_worker_info
from . import parent_watch
from .fds import InheritedFd
from .protocol import (
    BatchDone,
    IterationEnded,
    Ready,
    SampleFailed,
    Stage,
    StartupFailed,
    Stop,
    Task,
    TaskFailed,
)
from .remote_error import capture
from .status import StatusWriter


@dataclass(frozen=True)
class UserObjects:
    """What the user gave us that runs in the worker."""

    dataset: Any
    collate_fn: Callable[[Any], Any]
    worker_init_fn: Callable[[int], Any] | None


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: int
    num_workers: int
    base_seed: int
    iterable: bool
    auto_collation: bool
    drop_last: bool
    max_slots: int
    parent_pid: int
    skip_errors: bool = False  # on_error="skip": leave failing samples out
    tensors_in_main: bool = False  # the main process has torch: batches hold tensors


def worker_main(
    spec: WorkerSpec,
    user: UserObjects | InheritedFd,
    tasks: Connection,
    results: Connection,
    arena_fd: InheritedFd,
    stack_fd: InheritedFd,
) -> None:
    """Entry point of a worker process.

    ``user`` is the objects themselves under ``fork``, or a memfd holding them
    cloudpickled once for all workers under ``spawn`` / ``forkserver``.
    """
    # Ctrl-C reaches the whole process group; the main process alone handles
    # it and stops us, so the user sees one KeyboardInterrupt, not one per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_watch.die_with_parent(spec.parent_pid)
    # The main process asks for our Python stacks (a stalled task) with SIGUSR1;
    # faulthandler answers from C, even while Python code is stuck.
    faulthandler.register(signal.SIGUSR1, file=stack_fd.fd, all_threads=True, chain=False)
    arena = WorkerArena(arena_fd.fd, spec.max_slots)
    status = StatusWriter(arena.status_page)
    status.begin(-1, -1)
    status.stage(Stage.STARTUP)
    try:
        objects = user if isinstance(user, UserObjects) else _load_user_objects(user)
    except BaseException as exc:
        results.send(StartupFailed(Stage.STARTUP, capture(exc)))
        return
    seed = spec.base_seed + spec.worker_id
    set_worker_info(WorkerInfo(spec.worker_id, spec.num_workers, seed, objects.dataset))
    _seed_like_torch(spec.base_seed, spec.worker_id)
    status.stage(Stage.WORKER_INIT)
    if objects.worker_init_fn is not None:
        try:
            objects.worker_init_fn(spec.worker_id)
        except BaseException as exc:
            results.send(StartupFailed(Stage.WORKER_INIT, capture(exc)))
            return
    status.idle()
    results.send(Ready(spec.worker_id, os.getpid()))
    # Our own collate functions in a worker deferring torch return NumPy leaves
    # that stand for tensors: mark them so the main process makes tensors.
    as_tensors = spec.tensors_in_main and objects.collate_fn in (default_collate, default_convert)
    make_tensors_in_main(as_tensors)
    try:
        _serve(spec, objects, tasks, results, Encoder(arena, arrays_as_tensors=as_tensors), status)
    finally:
        # The process ends with os._exit (no atexit): close what the dataset
        # opened with conveyor.per_worker now.
        close_per_worker_resources()


def _serve(
    spec: WorkerSpec,
    objects: UserObjects,
    tasks: Connection,
    results: Connection,
    encoder: Encoder,
    status: StatusWriter,
) -> None:
    fetcher: MapFetcher | IterableFetcher
    if spec.iterable:
        fetcher = IterableFetcher(
            objects.dataset, spec.auto_collation, objects.collate_fn, spec.drop_last
        )
    else:
        fetcher = MapFetcher(objects.dataset, spec.auto_collation, objects.collate_fn)
    epoch = -1
    while True:
        try:
            message = tasks.recv()
        except (EOFError, OSError):
            return  # the main process is gone
        if isinstance(message, Stop):
            return
        assert isinstance(message, Task)
        encoder.arena.release(message.released)
        if message.epoch != epoch:
            epoch = message.epoch
            if isinstance(fetcher, IterableFetcher):
                fetcher.restart()
        status.begin(message.epoch, message.seq)
        reply = _run(message, fetcher, encoder, status, spec.skip_errors)
        status.idle()
        try:
            results.send(reply)
        except (BrokenPipeError, OSError):
            return


def _run(
    task: Task,
    fetcher: MapFetcher | IterableFetcher,
    encoder: Encoder,
    status: StatusWriter,
    skip_errors: bool,
) -> Any:
    stage = Stage.FETCH
    batch: Any = None
    skipped: list[SampleFailed] = []
    indices = None if isinstance(fetcher, IterableFetcher) else as_list(task.index)
    try:
        try:
            if isinstance(fetcher, MapFetcher) and (task.trace or task.exclude or skip_errors):
                data, indices, failed = _fetch_each(fetcher, task, status, skip_errors)
                skipped = [SampleFailed(i, Stage.FETCH, capture(e)) for i, e in failed]
                if data is None:
                    return BatchDone(task.epoch, task.seq, None, tuple(skipped))
            else:
                data = fetcher.fetch(task.index)
        except StopIteration:
            if isinstance(fetcher, IterableFetcher):
                return IterationEnded(task.epoch, task.seq)
            raise
        stage = Stage.COLLATE
        status.stage(stage)
        with encoder.collating():
            batch = _collate(fetcher.collate_fn, data, indices)
        stage = Stage.TRANSFER
        status.stage(stage)
        return BatchDone(task.epoch, task.seq, encoder.encode(batch), tuple(skipped))
    except Exception as exc:
        if stage is Stage.TRANSFER and isinstance(exc, (pickle.PicklingError, TypeError)):
            # Pickling failures get the culprit's path; UnpicklableError is both
            # of these types, so nothing the user catches changes. Any other
            # exception (one a __reduce__ raised itself) keeps its own type.
            exc = _explain_unsendable(batch, exc, task.index)
        if skip_errors and indices:
            # The whole batch goes: record each of its samples with the error.
            error = capture(exc)
            skipped += [SampleFailed(i, stage, error) for i in indices]
            return BatchDone(task.epoch, task.seq, None, tuple(skipped))
        return TaskFailed(task.epoch, task.seq, stage, capture(exc))


def _fetch_each(
    fetcher: MapFetcher, task: Task, status: StatusWriter, tolerate: bool
) -> tuple[Any, list[Any], list[tuple[Any, Exception]]]:
    """Fetch one sample at a time; ``data`` is None when none is left."""
    index = as_list(task.index)
    samples, kept, failed = fetcher.fetch_each(
        index,
        exclude=task.exclude,
        tolerate=tolerate,
        on_position=status.position if task.trace else None,
    )
    if not samples:
        return None, kept, failed
    return (samples if fetcher.auto_collation else samples[0]), kept, failed


def _collate(collate_fn: Callable[[Any], Any], data: Any, indices: list[Any] | None) -> Any:
    with collate_context(indices):
        return collate_fn(data)


def _explain_unsendable(batch: Any, exc: Exception, index: Any) -> Exception:
    from ..diagnostics.pickling import explain_unpicklable_sample

    indices = index if isinstance(index, list) else [index]
    try:
        explained = explain_unpicklable_sample(batch, exc, indices=indices)
    except Exception:  # the explanation must never hide the error itself
        return exc
    explained.__cause__ = exc
    return explained


def _load_user_objects(setup: InheritedFd) -> UserObjects:
    # Every worker shares this descriptor's file offset: map it, don't read it.
    try:
        size = os.fstat(setup.fd).st_size
        with mmap.mmap(setup.fd, size, prot=mmap.PROT_READ) as data:
            objects = cloudpickle.loads(data)
    finally:
        setup.close()
    assert isinstance(objects, UserObjects)
    return objects


def _seed_like_torch(base_seed: int, worker_id: int) -> None:
    """Seed ``random``, NumPy and torch exactly as torch's workers do."""
    from ..sampling import worker_seeds

    seeds = worker_seeds(base_seed, worker_id)
    random.seed(seeds.python)
    np.random.seed(seeds.numpy)

    def seed_torch(torch: Any) -> None:
        torch.manual_seed(seeds.torch)
        torch.set_num_threads(1)

    _torch.on_import(seed_torch)  # now, or when the worker first imports torch
