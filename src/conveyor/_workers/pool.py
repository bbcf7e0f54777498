"""Worker processes behind the pool protocol (see api.py).

Each worker is a process running a core (loop.py) with its own pipes and
shared-memory arena — or several cores, each in a thread with pipes and an arena of its
own (``threads_per_worker``): the loop sees each core as a worker, and this pool keeps
their process's life and death together (crashes.py is told which core's doing a death
was: see :meth:`WorkerPool._died`); the pool starts them (user_objects.py, start.py), sends tasks
without ever blocking (outbox.py), waits on result pipes and process sentinels
together, decodes batches lazily (a :class:`PayloadHandle` each), and stops them for
sure (teardown.py). Shared memory is dropped only after its workers are gone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

from .._task.protocol import (
    BatchDone,
    Died,
    EpochMessage,
    IterationEnded,
    Ready,
    StartupFailed,
    Stop,
    Task,
    TaskFailed,
)
from .._transport.budget import SlotBudget
from .._transport.codec import SlotPayload
from .._transport.decoder import PayloadHandle
from . import wire
from .api import Abilities, PoolEvent, Received
from .interrupts import interrupts_deferred
from .process import Host, Worker, WorkerHandle, release, start_worker
from .readings import Readings, RoomsAhead
from .selector import PoolSelector
from .spec import UserObjects, WorkerSpec
from .stacks import blame_cores, crashed_core
from .start import modules_to_preload
from .start_method import StartMethod
from .status import read_status
from .teardown import TERMINATE_GRACE_S, escalate, kill_descendants, stop_for_good
from .user_objects import serialize_once

_RESULT, _DEATH = "result", "death"  # what a watched descriptor is
# Slots freed go to their worker with its next task; this many pending at once (a
# discarded epoch) go in a frame of their own, as do any for a worker with no task left
# to answer: one that ran ahead to the end of its epoch gets no task to carry them, and
# would keep an outlier's slot until the next epoch. Looked at as the pool waits and as
# each batch is handed out.
RELEASE_ALONE = 4
# Freed slots this large go at once, alone, as the next batch is handed out or the pool
# waits: the worker fills its next batch into one of them instead of adding a slot (its
# next task, which would carry them, goes only once its last batch is handed out, and the
# worker has started another by then: see docs/design.md, "Memory").
RELEASE_EARLY_BYTES = 1 << 20
_new, _set = object.__new__, object.__setattr__


class WorkerPool(Readings):
    """Worker processes behind an event interface: :meth:`wait` returns what
    happened (messages, deaths) as values; everything else is asked of the
    pool by worker id."""

    def __init__(
        self,
        user: UserObjects,
        specs: Sequence[WorkerSpec],
        *,
        start_method: StartMethod,
        slots: SlotBudget,
        threads_per_worker: int = 1,
    ) -> None:
        """``slots``: each worker's (see arena.SlotBudget)."""
        self._workers: list[Worker] = []
        self._slots = slots
        self._rooms_ahead = RoomsAhead(slots)
        self._cores = threads_per_worker  # cores per process, each in a thread
        self._dead: set[int] = set()  # cores whose process's death was reported, not restarted
        self._killed: dict[int, int] = {}  # a process the pool killed (its pid) -> for which core
        self._retired: list[Worker] = []  # replaced: their batches may still be decoded
        self._let_go: set[int] = set()  # ids stopped for good (num_workers="auto")
        self._serving_now: list[Worker] | None = None  # see _serving
        self._closed = False
        self._owner_pid = os.getpid()
        self._method = start_method
        self._context = start_method.context()
        self._user = user
        self._specs = list(specs)
        # The serialized objects, kept until every worker has loaded them (then
        # freed: a 1 GiB dataset would cost 1 GiB of shared memory for the run);
        # a replacement worker gets them serialized again.
        self._setup: int | None = None
        self._each_start = False  # they must be pickled with each worker's start instead
        self._loading: set[int] = {spec.worker_id for spec in specs}
        self._preload = modules_to_preload(user.dataset, user.collate_fn, user.worker_init_fn)
        self._selector = PoolSelector()  # result pipes, sentinels, task pipes with bytes queued
        try:
            for first in range(0, len(specs), self._cores):
                self._start(specs[first : first + self._cores])
        except BaseException:
            self.close()
            raise

    def _start(self, specs: Sequence[WorkerSpec]) -> None:
        """Start a worker process running a core for each of ``specs``, and put them in
        their places in the pool.

        A Ctrl-C meanwhile is held back until it is there: cut anywhere between the
        first pipe made and that, it would leave descriptors (and a process) that
        teardown cannot find."""
        with interrupts_deferred():
            if self._method.pickles_objects and self._setup is None and not self._each_start:
                self._setup = serialize_once(self._user, self._method)
                self._each_start = self._setup is None
            self._loading.update(spec.worker_id for spec in specs)
            cores = start_worker(
                self._context,
                self._method,
                specs,
                self._user,
                self._setup,
                self._preload,
                self._slots,
            )
            self._serving_now = None
            for worker in cores:
                if worker.worker_id < len(self._workers):
                    self._workers[worker.worker_id] = worker  # a replacement
                else:
                    self._workers.append(worker)
                self._selector.watch(worker.reader.fd, _RESULT, worker)
            host = cores[0].host
            self._selector.watch(host.process.sentinel, _DEATH, host)

    def _unwatch(self, worker: Worker) -> None:
        """Stop watching a core's pipes and its process's sentinel (before they are
        closed)."""
        for fd in (worker.reader.fd, worker.process.sentinel, worker.outbox.fd):
            self._selector.unwatch(fd)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def abilities(self) -> Abilities:
        return Abilities(
            inspect=self, kill=self.kill, run_ahead=self._rooms_ahead, handles=self.handles,
            usage=self, resize=self,
        )  # fmt: skip

    # --- talking to workers ---------------------------------------------------------

    def send(self, worker_id: int, message: Task | EpochMessage) -> None:
        """Send a task (its frame carries the slots freed since), or what the next epoch
        starts with (kept for a replacement too); to a worker that just died it is simply
        lost: the caller re-sends what a dead worker had not answered."""
        worker = self._workers[worker_id]
        if type(message) is Task:
            # Worker.take_releases, inline: one call more would break the hand-out's call
            # budget (tests/integration/test_call_budget.py).
            if worker.decoder.dead:
                worker.decoder.collect()
            pending = worker.pending_releases
            released: tuple[int, ...] = ()
            if pending:
                released = tuple(pending)
                del pending[: len(released)]
            frame = wire.encode_task(message, released)
            try:
                if not worker.outbox.write(frame):  # never blocks (see _write)
                    self._selector.want_room(worker.outbox.fd, worker)
            except (BrokenPipeError, ConnectionResetError):
                worker.outbox.clear()  # it died: its sentinel says so
            worker.unanswered += 1
            return
        assert not isinstance(message, Task)
        self._specs[worker_id] = self._specs[worker_id].keeping(message)
        self._write(worker, wire.encode(message))

    def _release_alone(self) -> None:
        """Slots freed that no task is carrying (see RELEASE_ALONE and
        RELEASE_EARLY_BYTES): to their workers now, in a frame of their own. Looked at as
        the pool waits and as each batch is handed out."""
        for worker in self._serving_now or self._serving():
            if worker.decoder.dead:
                worker.decoder.collect()
            pending = len(worker.pending_releases)
            if pending and (
                pending >= RELEASE_ALONE
                or not worker.unanswered
                or worker.slot_bytes >= RELEASE_EARLY_BYTES
            ):
                self._write(worker, wire.encode_released(worker.take_releases()))

    def _write(self, worker: Worker, frame: bytes) -> None:
        """Never blocks (see outbox.py): what the pipe has no room for now waits, and the
        selector watches for room."""
        try:
            if not worker.outbox.write(frame):
                self._selector.want_room(worker.outbox.fd, worker)
        except (BrokenPipeError, ConnectionResetError):
            worker.outbox.clear()  # it died: its sentinel says so

    @staticmethod
    def _flush(worker: Worker) -> bool:
        """Write what waits for a task pipe's room; True when nothing is left."""
        try:
            return worker.outbox.flush()
        except (BrokenPipeError, ConnectionResetError):
            worker.outbox.clear()  # it died: its sentinel says so
            return True

    def wait(self, timeout: float | None) -> list[PoolEvent]:
        """Block until a worker sends something or dies, or ``timeout`` passes ([]).

        One read takes every frame a pipe holds; tasks queued for full pipes are written
        meanwhile.
        """
        events: list[PoolEvent] = []
        self._release_alone()
        deaths: list[Host] = []
        for role, owner in self._selector.select(timeout, self._flush):
            if role == _RESULT:
                reader = owner.reader
                messages = reader.read()
                if reader.eof:  # it exited: its sentinel says the rest
                    self._selector.unwatch(reader.fd)
                events += self._received(owner, messages)
            else:
                deaths.append(owner)
        for host in deaths:
            events += self._died(host)
        return events

    def _received(self, worker: Worker, messages: list[Any]) -> list[PoolEvent]:
        events: list[PoolEvent] = []
        worker_id = worker.worker_id
        for message in messages:
            kind = type(message)
            if kind is BatchDone or kind is TaskFailed or kind is IterationEnded:
                worker.unanswered -= 1  # a task's last message
            elif kind is Ready or kind is StartupFailed:
                self._loaded(worker_id)
            payload = getattr(message, "payload", None)
            handle = None
            if payload is not None:
                if type(payload) is SlotPayload:
                    # Map on receipt: the batch stays readable if the worker dies before
                    # the user takes it (the fd is closed when the worker is replaced).
                    slot = payload.slot
                    if slot.slot_id not in worker.arena.maps:
                        worker.arena.view(slot)
                    worker.slot_bytes = slot.size
                handle = PayloadHandle(worker.decoder, payload, self._release_alone)
            event = _new(Received)  # (once a batch: without the frozen __init__)
            _set(event, "__dict__", {"worker_id": worker_id, "message": message, "batch": handle})
            events.append(event)
        return events

    def _loaded(self, worker_id: int) -> None:
        """A worker is past loading the user's objects; free them once all are."""
        self._loading.discard(worker_id)
        if not self._loading and self._setup is not None:
            os.close(self._setup)
            self._setup = None

    def _died(self, host: Host) -> list[PoolEvent]:
        """Whatever the dead process's cores sent before it died, then their deaths.

        Of several cores, the one whose doing the death was is told apart (its thread
        crashed, by the crash dump; or the pool killed the process for it as stuck): the
        others are bystanders, no evidence against what they ran. When nothing says
        which (a kill from outside), each is a death, but one restart is charged."""
        cores = [self._workers[i] for i in host.cores]
        events: list[PoolEvent] = []
        for worker in cores:
            events += self._received(worker, worker.reader.drain())
            self._unwatch(worker)
        host.process.join(timeout=1.0)
        statuses = [read_status(worker.arena.status_page) for worker in cores]
        culprit = self._killed.pop(host.pid or -1, None)
        if culprit is None and len(cores) > 1:
            culprit = crashed_core(host.crash_dump(), dict(zip(host.cores, statuses, strict=True)))
        blames = blame_cores(host.cores, culprit)
        for worker, status, blame in zip(cores, statuses, blames, strict=True):
            self._dead.add(worker.worker_id)
            exitcode = host.process.exitcode
            events.append(Died(worker.worker_id, worker.pid, exitcode, status, blame=blame))
        return events

    # --- life and death -------------------------------------------------------------

    def handles(self) -> list[WorkerHandle]:
        """The current worker processes, for ``iterator._workers``."""
        return list({id(w.host): w.handle for w in self._serving()}.values())

    # --- how many workers (Abilities.resize) -------------------------------------------

    def add(self, spec: WorkerSpec) -> None:
        """Start one more worker (its id: the next one)."""
        assert spec.worker_id == len(self._workers), "workers are added in order"
        assert self._cores == 1, "num_workers='auto' counts processes of one core"
        self._start([spec])  # appends it, safe from Ctrl-C
        self._specs.append(spec)  # (once started: a start that fails adds nothing)

    def retire(self, worker_id: int) -> None:
        """Stop a worker that has no task left, for good (it is not replaced); whole, or
        teardown would not find a worker let go but not stopped."""
        worker = self._workers[worker_id]
        with interrupts_deferred():
            self._let_go.add(worker_id)
            self._serving_now = None
            with contextlib.suppress(OSError, ValueError):
                worker.outbox.send(Stop())
            escalate([worker])
            self._unwatch(worker)
            kill_descendants(worker.pid)
            release(worker)
            self._retired.append(worker)  # its batches the user holds stay readable

    def _serving(self) -> list[Worker]:
        """The workers not let go (asked for several times a batch: kept until they change)."""
        serving = self._serving_now
        if serving is None:
            let_go = self._let_go
            serving = [w for i, w in enumerate(self._workers) if i not in let_go]
            self._serving_now = serving
        return serving

    def restart(self, worker_id: int) -> None:
        """Start a new worker in place of a dead one (same id, same seed): its whole
        process, with every core it ran. The restart of a core whose process was already
        started again for a sibling's death does nothing."""
        host = self._workers[worker_id].host
        if len(host.cores) > 1 and worker_id not in self._dead:
            return
        host.process.join(timeout=TERMINATE_GRACE_S)
        if host.process.exitcode is None:
            host.process.kill()
            host.process.join()
        # As one step: a Ctrl-C in between left released workers in the pool (teardown
        # stumbled on their closed process objects, and left the others running).
        with interrupts_deferred():
            kill_descendants(host.pid)
            for core in host.cores:
                old = self._workers[core]
                self._unwatch(old)
                release(old)
                self._retired.append(old)
                self._dead.discard(core)
            self._start([self._specs[core] for core in host.cores])

    def kill(self, worker_id: int) -> None:
        """Kill a stuck worker; its sentinel then reports it like any death."""
        worker = self._workers[worker_id]
        if worker.process.exitcode is None:
            if worker.pid is not None:
                self._killed[worker.pid] = worker_id  # its siblings die as bystanders
            worker.process.kill()

    def close(self) -> None:
        """Stop every worker and what they started, then free their resources; safe
        to call twice. A Ctrl-C meanwhile is held back until teardown is complete
        (it takes a few seconds at most), so nothing is left behind by it."""
        with interrupts_deferred():  # (from the first line: marked closed, it is torn down)
            if self._closed:
                return
            self._closed = True
            if os.getpid() != self._owner_pid:
                # A forked child (one of ours, or another library's) inherited this
                # pool; the workers are not its children. Leave them to their owner.
                return
            self._teardown()

    def _teardown(self) -> None:
        stop_for_good(self._serving(), self._unwatch)
        for worker in self._retired:
            worker.arena.drop_maps()
        self._retired.clear()
        self._selector.close()
        if self._setup is not None:
            os.close(self._setup)
            self._setup = None
