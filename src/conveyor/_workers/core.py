"""The worker core: serve tasks against an inbox, an outbox and a status sink.

Every kind of worker runs this: a worker process (``loop.py`` wraps it in the process's
set-up: signals, its process group, the shared-memory arena), thread workers, remote
workers, and the fake pool of the loop's tests. The core holds no descriptor, sends no
signal and touches no module global: what is the worker's own (its info, generators,
``per_worker`` resources, collate's flags) lives in its :class:`WorkerScope`, current
while the core runs, so several cores can share a process.

Workers are stateless executors of tasks (an iterable-style dataset's iterator aside).
Every exception raised by user code is caught here with the stage it happened in and
sent back as a value; the main process decides what to do.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from typing import Any

from .. import _torch
from .._task.compat import assert_never
from .._task.dataset_calls import DatasetCall, replay
from .._task.dataset_state import WorkerState
from .._task.protocol import (
    BatchDone,
    IterationEnded,
    MainMessage,
    Ready,
    ReplayCalls,
    SampleFailed,
    SeedPipe,
    Stage,
    StartupFailed,
    Stop,
    Task,
    TaskFailed,
    TaskReply,
    builder,
)
from .._task.runner import (
    Abandoned,
    Collated,
    Exhausted,
    Failed,
    LeftOut,
    NothingLeft,
    TaskOutcome,
    TaskRunner,
)
from .._torch import datapipes as _datapipes
from ..collate import default_collate, default_convert
from ..resources import close_all as close_per_worker_resources
from ..sampling._reseed import Reseed, kept_global_rngs
from ..worker_info import WorkerInfo, install_in_torch
from . import scope as _scope
from .remote_error import capture
from .scope import GLOBAL_GENERATORS
from .spec import IN_PLACE, UNWATCHED, Inbox, Outbox, StatusSink, Transport, UserObjects, WorkerSpec
from .thread_draws import route_module_draws

__all__ = ["STOP", "WorkerCore", "sent"]


STOP = object()  # what handle() returns for a Stop: the core is done
_batch_done = builder(BatchDone)  # once a batch: without the frozen __init__'s cost


class WorkerCore:
    """One worker's serving of tasks (see the module docstring).

    ``owns_process``: this core is its process's only worker, as torch's workers are:
    it seeds the process-wide generators and sets torch's threads and worker info too.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        user: UserObjects,
        transport: Transport,
        status: StatusSink,
        *,
        owns_process: bool,
    ) -> None:
        self.spec = spec
        self.user = user
        self.transport = transport
        self.status = status
        self._owns_process = owns_process
        self.scope = _scope.WorkerScope(owns_globals=owns_process)
        self.runner: TaskRunner | None = None
        self._in_worker = True  # (False: the training thread's, see in_training_thread)
        # The runner was made for the first epoch, whichever it is (unless restored as
        # an ended epoch left it).
        self._epoch: int | None = -1 if spec.new_epoch_first else None
        self._first_of_epoch = True
        self._call_failed: BaseException | None = None  # a replayed call raised (_replay)

    # --- start-up ---------------------------------------------------------------------

    def start(self) -> Ready | StartupFailed:
        """Seed, run ``worker_init_fn``, restore a saved state: the first message."""
        with _scope.entered(self.scope):
            return self._start()

    def _start(self) -> Ready | StartupFailed:
        spec, user, scope = self.spec, self.user, self.scope
        seed = spec.base_seed + spec.worker_id
        scope.info = WorkerInfo(
            spec.worker_id, spec.num_workers, seed, user.dataset, scope.rng, spec.worker_method
        )
        install_in_torch(scope, process_wide=self._owns_process)
        if not self._owns_process:  # random's and NumPy's module draws: this core's own
            route_module_draws()
        self._seed_like_torch()
        if spec.calls:  # the training loop's calls since this copy was made (set_epoch...)
            self.status.stage(Stage.FETCH)
            try:
                self._replay_kept(spec.calls)
            except BaseException as exc:
                return StartupFailed(Stage.FETCH, capture(exc))
        self.status.stage(Stage.WORKER_INIT)
        try:
            if spec.pipe_seed is not None:  # as torch does, before the user's worker_init_fn
                _datapipes.seed_graph(user.dataset, spec.pipe_seed)
                _datapipes.shard(user.dataset, spec.worker_id, spec.num_workers)
            if user.worker_init_fn is not None:
                user.worker_init_fn(spec.worker_id)
        except BaseException as exc:
            return StartupFailed(Stage.WORKER_INIT, capture(exc))
        try:
            resume = pickle.loads(spec.resume_state) if spec.resume_state is not None else None
            self.runner = _runner(spec, user, resume)
            state = self._pickled_state() if spec.report_state else None
        except BaseException as exc:  # restoring the dataset's saved state failed
            return StartupFailed(Stage.FETCH, capture(exc))
        # Our own collate functions, in a worker deferring torch, return NumPy leaves
        # that stand for tensors: mark them so the main process makes tensors.
        as_tensors = spec.tensors_in_main and user.collate_fn in (default_collate, default_convert)
        scope.tensors_in_main = self.transport.arrays_as_tensors = as_tensors
        self.status.idle()
        return Ready(spec.worker_id, os.getpid(), state)

    def _seed_like_torch(self) -> None:
        """Seed ``random``, NumPy and torch exactly as torch's workers do (the process's
        generators, for a core that owns its process; always its own)."""
        from ..sampling._seeds import worker_seeds

        seeds = worker_seeds(self.spec.base_seed, self.spec.worker_id)
        self.scope.seed_each(seeds.python, seeds.numpy, seeds.torch)
        if self._owns_process:

            def one_thread(torch: Any) -> None:
                torch.manual_seed(seeds.torch)  # every device's generator, as torch seeds
                torch.set_num_threads(1)

            _torch.on_import(one_thread)  # now, or when the worker first imports torch

    # --- serving ----------------------------------------------------------------------

    def serve(self, inbox: Inbox, outbox: Outbox) -> None:
        """Answer messages until a Stop, or until the main side is gone."""
        with _scope.entered(self.scope):
            while True:
                try:
                    message = inbox.recv()
                except (EOFError, OSError):
                    return  # the main side is gone
                reply = self._handle(message)
                if reply is STOP:
                    return
                if reply is not None:
                    try:
                        outbox.send(reply)
                    except OSError:  # BrokenPipeError included
                        return

    def handle(self, message: MainMessage) -> Any:
        """One message: its reply (a task's), None (nothing to say), or :data:`STOP`."""
        with _scope.entered(self.scope):
            return self._handle(message)

    def close(self) -> None:
        """What the dataset opened with ``conveyor.per_worker`` in this core is closed."""
        with _scope.entered(self.scope):
            close_per_worker_resources()

    def _handle(self, message: MainMessage) -> Any:
        match message:
            case Task():
                if self.status.stop_requested():  # teardown: the tasks queued are not wanted
                    return STOP
                return self._task(message)
            case SeedPipe():
                _datapipes.seed_graph(self.user.dataset, message.seed)
                return None
            case ReplayCalls(calls=calls):
                self._replay(calls)
                return None
            case Stop():
                return STOP
            case _:
                assert_never(message)

    def _replay(self, calls: tuple[DatasetCall, ...]) -> None:
        """The training loop's calls on the main process's dataset, made on this copy as
        an epoch starts. What one raises fails the next task instead (the loop raises it
        at that batch's place, with this worker's note)."""
        try:
            self._replay_kept(calls)
        except BaseException as exc:
            self._call_failed = exc

    def _replay_kept(self, calls: tuple[DatasetCall, ...]) -> None:
        """The calls change this copy of the dataset, not the worker's random streams,
        seeded per worker as torch seeds them (a set_epoch that calls random.seed(epoch)
        would give every worker the same draws)."""
        with kept_global_rngs(with_torch=self._owns_process):
            replay(self.user.dataset, calls)

    def _task(self, task: Task) -> TaskReply | object:
        """A task's reply; :data:`STOP` when the core was told to stop in the middle of
        it (its batch is abandoned: nobody wants it)."""
        if (failed := self._call_failed) is not None:
            self._call_failed = None
            return TaskFailed(task.epoch, task.seq, Stage.FETCH, capture(failed))
        started = time.monotonic()
        outcome, epoch_state = self._outcome(task)
        if isinstance(outcome, Abandoned):
            return STOP
        reply = self._reply(task, outcome, started)
        if task.want_state or epoch_state is not None:
            state = self._pickled_state() if task.want_state else None
            reply = dataclasses.replace(reply, state=state, epoch_state=epoch_state)
        if self.spec.iterable and self._first_of_epoch and isinstance(reply, BatchDone):
            self._first_of_epoch = False
            reply = dataclasses.replace(reply, asked_worker_info=self.scope.consulted)
        self.status.idle()
        return reply

    def _outcome(self, task: Task) -> tuple[TaskOutcome, bytes | None]:
        """Run ``task``: its outcome, and the dataset's state as its epoch began when it
        is the first of an epoch (and the spec says to report it)."""
        spec, runner = self.spec, self.runner
        assert runner is not None, "start() first"
        epoch_state = None
        if task.epoch != self._epoch:
            self._first_of_epoch = True
            if self._epoch is not None:
                runner.new_epoch()
                if spec.report_state:
                    epoch_state = self._pickled_state()
            self._epoch = task.epoch
        self.status.begin(task.epoch, task.seq)
        reseed = None
        if spec.reseed != "worker":
            where = (task.epoch, task.seq, task.first_sample)
            generators = self.scope if self._in_worker else GLOBAL_GENERATORS
            reseed = Reseed(
                spec.reseed, spec.base_seed, *where, generators=generators, places=task.places
            )
        outcome = runner.run(
            task.index,
            exclude=task.exclude,
            trace=task.trace,
            watcher=self.status,
            collating=self.transport.collating,
            reseed=reseed,
        )
        return outcome, epoch_state

    def _reply(self, task: Task, outcome: TaskOutcome, started: float) -> TaskReply:
        """The one message that answers ``task``: the batch encoded for the transport,
        or what failed, as values that cross to the main process."""
        runner, transport = self.runner, self.transport
        assert runner is not None
        if isinstance(outcome, Collated):
            self.status.stage(Stage.TRANSFER)
            if transport.arrays_as_tensors and not self.scope.tensors_in_main:
                # A registered collate function ran: NumPy leaves are NumPy from now on.
                transport.arrays_as_tensors = False
            encoding = time.monotonic()
            try:
                payload = transport.encode(outcome.batch)
            except Exception as exc:
                if isinstance(exc, (pickle.PicklingError, TypeError)):
                    # Pickling failures get the culprit's path; UnpicklableError is both
                    # of these types, so nothing the user catches changes. Any other
                    # exception (one a __reduce__ raised itself) keeps its own type.
                    exc = _explain_unsendable(outcome.batch, exc, outcome.indices or [])
                outcome = runner.batch_failed(
                    Stage.TRANSFER, exc, outcome.indices, outcome.left_out
                )
            else:
                done = time.monotonic()
                return _batch_done(
                    epoch=task.epoch,
                    seq=task.seq,
                    payload=payload,
                    skipped=sent(outcome.left_out) if outcome.left_out else (),
                    busy_s=done - started,
                    started=started,
                    fetch_s=runner.fetch_s,
                    collate_s=runner.collate_s,
                    encode_s=done - encoding,
                )
        match outcome:
            case NothingLeft(left_out=left_out):
                busy = time.monotonic() - started
                return BatchDone(
                    task.epoch,
                    task.seq,
                    None,
                    sent(left_out),
                    busy,
                    started=started,
                    fetch_s=runner.fetch_s,
                    collate_s=runner.collate_s,
                )
            case Failed(stage=stage, error=error, culprit=culprit):
                return TaskFailed(task.epoch, task.seq, stage, capture(error), culprit=culprit)
            case Exhausted():
                return IterationEnded(task.epoch, task.seq)
            case Abandoned():
                raise AssertionError("unreachable: an abandoned task has no reply")
            case Collated():
                raise AssertionError("unreachable: a collated batch was encoded above")
            case _:
                assert_never(outcome)

    # --- the training thread (num_workers=0) --------------------------------------------

    @classmethod
    def in_training_thread(
        cls, spec: WorkerSpec, user: UserObjects, resume: WorkerState | None
    ) -> WorkerCore:
        """A core the training thread runs itself (``num_workers=0``). That thread is no
        worker: it gets no worker info, no seeding and no ``worker_init_fn``, and tasks
        run in its own scope (:meth:`run_here`). Only the runner is made, from ``resume``;
        an iterable dataset whose ``iter()`` raised raises here, at the loader's
        ``iter()``, as torch raises it."""
        core = cls(spec, user, IN_PLACE, UNWATCHED, owns_process=True)
        core._in_worker = False
        core.runner = _runner(spec, user, resume)
        init_error = getattr(core.runner.fetcher, "init_error", None)
        if init_error is not None:
            raise init_error
        return core

    def run_here(self, task: Task) -> TaskOutcome:
        """Run ``task`` in this thread as it is (the training thread's core): its outcome,
        with the user's exception as it was raised (nothing crosses a process)."""
        return self._outcome(task)[0]

    def _pickled_state(self) -> bytes:
        # Plain pickle, not the pipe's: a tensor in the state travels by value, not as a
        # shared-memory handle that would outlive this worker.
        assert self.runner is not None
        return pickle.dumps(self.runner.state(), protocol=pickle.HIGHEST_PROTOCOL)


def sent(left_out: tuple[LeftOut, ...]) -> tuple[SampleFailed, ...]:
    """Samples left out, as the main side is told of them."""
    return tuple(SampleFailed(item.index, item.stage, capture(item.error)) for item in left_out)


def _explain_unsendable(batch: Any, exc: Exception, indices: list[Any]) -> Exception:
    from ..diagnostics.pickling import explain_unpicklable_sample

    try:
        explained = explain_unpicklable_sample(batch, exc, indices=indices)
    except Exception:  # the explanation must never hide the error itself
        return exc
    explained.__cause__ = exc
    return explained


def _runner(spec: WorkerSpec, user: UserObjects, resume: Any) -> TaskRunner:
    """The task runner a core runs its tasks with, from its spec and the user's objects."""
    return TaskRunner(
        user.dataset,
        iterable=spec.iterable,
        auto_collation=spec.auto_collation,
        collate_fn=user.collate_fn,
        drop_last=spec.drop_last,
        skip_errors=spec.skip_errors,
        resume=resume,
    )
