"""The worker process: receive tasks, fetch, collate, send the batch back.

Workers are stateless executors of tasks (an iterable-style dataset's iterator
aside). Every exception raised by user code is caught here with the stage it
happened in and sent back; the main process decides what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import gc
import mmap
import os
import pickle
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np

from .. import _datapipes, _torch, worker_info
from .._compat import assert_never
from .._reseed import Reseed
from .._task import Collated, Exhausted, Failed, LeftOut, NothingLeft, TaskRunner
from .._transport.arena import WorkerArena
from .._transport.codec import Encoder, SlotPayload
from .._transport.inherited import release_foreign_memory
from ..collate import default_collate, default_convert, make_tensors_in_main
from ..resources import close_all as close_per_worker_resources
from ..worker_info import WorkerInfo, set_worker_info
from . import parent_watch
from .fds import InheritedFd
from .heap import HeapKeeper
from .inbox import Inbox
from .protocol import (
    BatchDone,
    IterationEnded,
    MainMessage,
    Ready,
    Release,
    SampleFailed,
    SeedPipe,
    Stage,
    StartupFailed,
    Stop,
    Task,
    TaskFailed,
)
from .remote_error import capture
from .status import StatusWriter
from .wire import send


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
    reseed: str = "worker"  # see conveyor._reseed
    report_state: bool = False  # the dataset keeps a state: report it (Ready, replies)
    resume_state: bytes | None = None  # a pickled WorkerState to restore at start-up
    new_epoch_first: bool = False  # that state is an ended epoch's: the first task starts anew
    pipe_seed: int | None = None  # an IterDataPipe dataset: its shared seed (_datapipes)
    run_ahead_bytes: int = 0  # small batches: slots beyond max_slots (arena.RUN_AHEAD_BYTES)


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
    # Lead a process group of our own: what the dataset starts (a decoder, a
    # multiprocessing.Pool) joins it, and teardown kills the group after us.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    parent_watch.die_with_parent(spec.parent_pid)
    # The main process asks for our Python stacks (a stalled task) with SIGUSR1;
    # faulthandler answers from C, even while Python code is stuck.
    faulthandler.register(signal.SIGUSR1, file=stack_fd.fd, all_threads=True, chain=False)
    # What this process inherited (from the training process, or the fork server) stays
    # out of its garbage collections: each would write to every inherited object's
    # header, copying its page.
    gc.freeze()
    heap = HeapKeeper()  # before the user's objects allocate: see heap.py
    if isinstance(user, UserObjects):  # forked: other loaders' shared memory came along
        release_foreign_memory(arena_fd.fd)
    arena = WorkerArena(arena_fd.fd, spec.max_slots, run_ahead_bytes=spec.run_ahead_bytes)
    status = StatusWriter(arena.status_page)
    status.begin(-1, -1)
    status.stage(Stage.STARTUP)
    try:
        objects = user if isinstance(user, UserObjects) else _load_user_objects(user)
    except BaseException as exc:
        send(results.fileno(), StartupFailed(Stage.STARTUP, capture(exc)))
        return
    seed = spec.base_seed + spec.worker_id
    set_worker_info(WorkerInfo(spec.worker_id, spec.num_workers, seed, objects.dataset))
    _seed_like_torch(spec.base_seed, spec.worker_id)
    status.stage(Stage.WORKER_INIT)
    try:
        if spec.pipe_seed is not None:  # as torch does, before the user's worker_init_fn
            _datapipes.seed_graph(objects.dataset, spec.pipe_seed)
            _datapipes.shard(objects.dataset, spec.worker_id, spec.num_workers)
        if objects.worker_init_fn is not None:
            objects.worker_init_fn(spec.worker_id)
    except BaseException as exc:
        send(results.fileno(), StartupFailed(Stage.WORKER_INIT, capture(exc)))
        return
    try:
        resume = pickle.loads(spec.resume_state) if spec.resume_state is not None else None
        runner = TaskRunner(
            objects.dataset,
            iterable=spec.iterable,
            auto_collation=spec.auto_collation,
            collate_fn=objects.collate_fn,
            drop_last=spec.drop_last,
            skip_errors=spec.skip_errors,
            resume=resume,
        )
        state = _pickled_state(runner) if spec.report_state else None
    except BaseException as exc:  # restoring the dataset's saved state failed
        send(results.fileno(), StartupFailed(Stage.FETCH, capture(exc)))
        return
    status.idle()
    send(results.fileno(), Ready(spec.worker_id, os.getpid(), state))
    # Our own collate functions in a worker deferring torch return NumPy leaves
    # that stand for tensors: mark them so the main process makes tensors.
    as_tensors = spec.tensors_in_main and objects.collate_fn in (default_collate, default_convert)
    make_tensors_in_main(as_tensors)
    try:
        inbox = Inbox(tasks.fileno(), arena)
        encoder = Encoder(arena, arrays_as_tensors=as_tensors, reclaim=inbox.reclaim)
        _serve(spec, runner, inbox, results, encoder, status, heap)
    finally:
        # The process ends with os._exit (no atexit): close what the dataset
        # opened with conveyor.per_worker now.
        close_per_worker_resources()


def _serve(
    spec: WorkerSpec,
    runner: TaskRunner,
    inbox: Inbox,
    results: Connection,
    encoder: Encoder,
    status: StatusWriter,
    heap: HeapKeeper,
) -> None:
    # The runner was made for the first epoch, whichever it is (unless restored as an
    # ended epoch left it).
    epoch: int | None = -1 if spec.new_epoch_first else None
    first_of_epoch = True
    out = results.fileno()
    while True:
        try:
            message: MainMessage = inbox.recv()
        except (EOFError, OSError):
            return  # the main process is gone
        match message:
            case Stop():
                return
            case Release():
                encoder.arena.release(message.released)
                encoder.arena.trim()
            case SeedPipe():
                _datapipes.seed_graph(runner.dataset, message.seed)
            case Task():
                if status.stop_requested():  # teardown: the tasks queued are not wanted
                    return
                encoder.arena.release(message.released)
                epoch_state = None
                if message.epoch != epoch:
                    first_of_epoch = True
                    if epoch is not None:
                        runner.new_epoch()
                        if spec.report_state:
                            epoch_state = _pickled_state(runner)
                    epoch = message.epoch
                status.begin(message.epoch, message.seq)
                reseed = None
                if spec.reseed != "worker":
                    where = (message.epoch, message.seq, message.first_sample)
                    reseed = Reseed(spec.reseed, spec.base_seed, *where)
                reply = _run(message, runner, encoder, status, time.perf_counter(), reseed)
                if message.want_state or epoch_state is not None:
                    state = _pickled_state(runner) if message.want_state else None
                    reply = dataclasses.replace(reply, state=state, epoch_state=epoch_state)
                if spec.iterable and first_of_epoch and isinstance(reply, BatchDone):
                    first_of_epoch = False
                    reply = dataclasses.replace(reply, asked_worker_info=worker_info.consulted())
                status.idle()
                if isinstance(reply, BatchDone) and isinstance(reply.payload, SlotPayload):
                    heap.batch_made(reply.payload.slot.size)
                try:
                    send(out, reply)
                except (BrokenPipeError, OSError):
                    return
            case _:
                assert_never(message)


def _run(
    task: Task,
    runner: TaskRunner,
    encoder: Encoder,
    status: StatusWriter,
    started: float,
    reseed: Reseed | None = None,
) -> BatchDone | TaskFailed | IterationEnded:
    outcome = runner.run(
        task.index,
        exclude=task.exclude,
        trace=task.trace,
        progress=status,
        collating=encoder.collating,
        reseed=reseed,
    )
    if isinstance(outcome, Collated):
        status.stage(Stage.TRANSFER)
        try:
            payload = encoder.encode(outcome.batch)
        except Exception as exc:
            if isinstance(exc, (pickle.PicklingError, TypeError)):
                # Pickling failures get the culprit's path; UnpicklableError is both
                # of these types, so nothing the user catches changes. Any other
                # exception (one a __reduce__ raised itself) keeps its own type.
                exc = _explain_unsendable(outcome.batch, exc, outcome.indices or [])
            outcome = runner.batch_failed(Stage.TRANSFER, exc, outcome.indices, outcome.left_out)
        else:
            busy = time.perf_counter() - started
            return BatchDone(task.epoch, task.seq, payload, _sent(outcome.left_out), busy)
    match outcome:
        case NothingLeft(left_out=left_out):
            busy = time.perf_counter() - started
            return BatchDone(task.epoch, task.seq, None, _sent(left_out), busy)
        case Failed(stage=stage, error=error):
            return TaskFailed(task.epoch, task.seq, stage, capture(error))
        case Exhausted():
            return IterationEnded(task.epoch, task.seq)
        case Collated():
            raise AssertionError("unreachable: a collated batch was encoded above")
        case _:
            assert_never(outcome)


def _pickled_state(runner: TaskRunner) -> bytes:
    # Plain pickle, not the pipe's: a tensor in the state travels by value, not as a
    # shared-memory handle that would outlive this worker.
    return pickle.dumps(runner.state(), protocol=pickle.HIGHEST_PROTOCOL)


def _sent(left_out: tuple[LeftOut, ...]) -> tuple[SampleFailed, ...]:
    return tuple(SampleFailed(item.index, item.stage, capture(item.error)) for item in left_out)


def _explain_unsendable(batch: Any, exc: Exception, indices: list[Any]) -> Exception:
    from ..diagnostics.pickling import explain_unpicklable_sample

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
