"""Remote workers: ``num_workers`` Ray actors, each running a WorkerCore, behind the pool
protocol (api.py). The driver keeps every rule: the loop and its task book do not know
the workers are remote.

* The user's objects are cloudpickled once and put in Ray's object store; every actor,
  and every replacement, reads them from there (ray_actor.py).
* Each message to a worker is a call on its actor, whose reply comes back as an object
  reference; ``wait`` blocks in ``ray.wait`` on all of them. Ray runs an actor's calls in
  the order made, so the oldest call not answered is the one running: that is the
  worker's status (task, for how long) without asking it anything.
* A batch comes back through the object store (_transport/object_store.py): fetched to
  this node when its reply is received, read in place, so it stays readable if its
  worker or node is lost later. At most ``prefetch_factor`` tasks per worker are out
  (the book's rule), so the store holds about that many batches per worker on their
  account, plus those the user keeps.
* A lost actor (killed, its process dead, its node lost, unreachable) shows as errors
  on its calls: its replies that did arrive are received first, then its death. Ray
  does not say how its process ended, so a death is weak evidence against a sample
  (see book.py), and a traced retry's position comes from the trace board
  (ray_cluster.TraceBoard), which outlives the node.
* Ray gives no event when the cluster itself is gone (the head node): while nothing
  arrives, the pool asks the head every PROBE_EVERY_S whether it is there, and raises
  ClusterLostError if not, rather than wait for replies that cannot come.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._task.protocol import (
    GONE,
    BatchDone,
    Died,
    EpochMessage,
    Ready,
    Stage,
    StartupFailed,
    Task,
    WorkerStatus,
)
from .._transport.object_store import ObjectStoreBatch, StorePayload
from ..errors import ClusterCapacityWarning, ClusterLostError
from . import ray_cluster
from .api import Abilities, PoolEvent, Received
from .ray_actor import ConveyorWorker
from .remote_error import capture
from .spec import UserObjects, WorkerSpec
from .user_objects import serialize_for_cluster

__all__ = ["RayPool"]

PROBE_EVERY_S = 10.0  # while nothing arrives: is the cluster's head node still there?
SETTLE_S = 10.0  # a lost actor's other calls: how long Ray may take to fail them
STOP_GRACE_S = 5.0  # close(): how long a worker may take to finish its task and stop


@dataclass
class _Call:
    ref: Any  # Ray's object reference to the reply
    task: Task | None  # None: the actor's start
    sent_at: float


class _Remote:
    """One incarnation of a worker: its actor, and its calls not answered yet, in the
    order made (which is the order the actor runs them)."""

    def __init__(self, worker_id: int, actor: Any, now: float, started_key: bytes) -> None:
        self.worker_id = worker_id
        self.actor = actor
        self.started_key = started_key  # where it says it started (its Ready may be lost)
        self.calls: deque[_Call] = deque()
        self.pid: int | None = None
        self.started = False
        self.lost = False
        self.killed = False  # as stuck: it reads as gone until replaced (see api.Abilities)
        self.created_at = self.last_reply_at = now

    def status(self, now: float, trace: tuple[int, int, int] | None = None) -> WorkerStatus:
        """What it is doing: starting, running its oldest unanswered task (since that
        task was sent or the one before it answered), or idle."""
        if not self.started:
            return WorkerStatus(-1, -1, Stage.STARTUP, -1, now - self.created_at)
        running = next((c for c in self.calls if c.task is not None), None)
        if running is None or running.task is None:
            return WorkerStatus(-1, -1, None, -1, now - self.last_reply_at)
        task = running.task
        began = max(running.sent_at, self.last_reply_at)
        position = -1
        if task.trace and trace is not None and trace[:2] == (task.epoch, task.seq):
            position = trace[2]
        # The stage is not known from here: "fetch" stands for all of the task's work.
        return WorkerStatus(task.epoch, task.seq, Stage.FETCH, position, now - began)


class RayPool:
    """Ray actors behind the pool protocol (see the module docstring)."""

    def __init__(
        self,
        user: UserObjects,
        specs: Sequence[WorkerSpec],
        *,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._closed = self._cluster_lost = False
        self._specs = list(specs)
        self._workers: list[_Remote] = []
        self._waiting: dict[Any, _Remote] = {}  # reference -> the incarnation it is for
        self._heard_at = time.monotonic()  # when a reply last came, or the head answered
        blob = serialize_for_cluster(user)  # before connecting: a failure costs nothing
        self._ray = ray_cluster.connect()
        self._actor_class = ray_cluster.actor_class(ConveyorWorker, options)
        short = ray_cluster.shortfall(options, len(self._specs))
        if short is not None:  # Ray would make them wait, silently
            warnings.warn(short, ClusterCapacityWarning, stacklevel=5)  # the user's iter()
        self._board = ray_cluster.TraceBoard(f"trace/{uuid.uuid4().hex}")
        self._launches = 0  # incarnations started: each marks its start under its own key
        # Once for every worker and replacement, read in place by each (bytes would be
        # copied into each actor's memory).
        self._user = self._ray.put(np.frombuffer(blob, dtype=np.uint8))
        del blob
        try:
            self._workers = [self._launch(spec) for spec in self._specs]
        except BaseException:
            self.close()
            raise

    def _launch(self, spec: WorkerSpec) -> _Remote:
        self._launches += 1
        started_key = self._board.started_key(spec.worker_id, self._launches)
        trace_key = self._board.key(spec.worker_id)
        actor = self._actor_class.remote(spec, self._user, trace_key, started_key)
        remote = _Remote(spec.worker_id, actor, time.monotonic(), started_key)
        self._call(remote, actor.start.remote(), None)
        return remote

    def _call(self, remote: _Remote, ref: Any, task: Task | None) -> None:
        remote.calls.append(_Call(ref, task, time.monotonic()))
        self._waiting[ref] = remote

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def abilities(self) -> Abilities:
        return Abilities(inspect=self, kill=self.kill)

    # --- talking to workers -------------------------------------------------------------

    def send(self, worker_id: int, message: Task | EpochMessage) -> None:
        """A call on the worker's actor (Ray queues it: never blocks). To a lost worker a
        task is dropped: the loop re-sends it to the replacement, after the death."""
        remote = self._workers[worker_id]
        if not isinstance(message, Task):  # what a replacement starts with too
            self._specs[worker_id] = self._specs[worker_id].keeping(message)
        if remote.lost:
            return
        ref = remote.actor.handle.remote(message)
        if isinstance(message, Task):
            self._call(remote, ref, message)

    def wait(self, timeout: float | None) -> list[PoolEvent]:
        """Block until a worker answers or is lost, or ``timeout`` passes ([]).
        Raises ClusterLostError when the cluster's head node no longer answers: asked
        once nothing has come for PROBE_EVERY_S, however the loop slices its waits."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            probe_at = self._heard_at + PROBE_EVERY_S
            until = probe_at if end is None else min(end, probe_at)
            ready = self._ready(max(0.0, until - time.monotonic()))
            now = time.monotonic()
            if ready:
                self._heard_at = now
                return self._events(ready)
            if now >= probe_at:
                self._check_cluster()
                self._heard_at = now
            if end is not None and now >= end:
                return []

    def _ready(self, timeout: float) -> set[Any]:
        if not self._ray.is_initialized():  # Ray's calls would start a new local Ray
            self._check_cluster()
        refs = list(self._waiting)
        if not refs:  # nothing out (the loop asks only for a deadline): just the wait
            threading.Event().wait(timeout)
            return set()
        try:
            first, _ = self._ray.wait(refs, num_returns=1, timeout=timeout)
            if not first:
                return set()
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        except Exception as exc:  # Ray itself fails: the cluster may be gone
            _raise_if_interrupted(exc)
            self._check_cluster()
            raise ClusterLostError(f"Ray failed while waiting for the workers: {exc}") from exc
        return set(ready) | set(first)

    def _events(self, ready: set[Any]) -> list[PoolEvent]:
        """What came, each worker's in the order its calls were made."""
        events: list[PoolEvent] = []
        for remote in list(self._workers):
            for call in list(remote.calls):
                if remote.lost or call.ref not in ready:
                    continue
                events += self._take(remote, call)
        return events

    def _take(self, remote: _Remote, call: _Call) -> list[PoolEvent]:
        try:
            reply = self._ray.get(call.ref)  # here already: read in place
        except Exception as exc:  # a RayError: the actor or its reply is lost
            _raise_if_interrupted(exc)
            return self._lost(remote, call, exc)
        return [self._received(remote, call, reply)]

    def _received(self, remote: _Remote, call: _Call, reply: Any) -> Received:
        remote.calls.remove(call)
        del self._waiting[call.ref]
        remote.last_reply_at = time.monotonic()
        if isinstance(reply, Ready):
            remote.started, remote.pid = True, reply.pid
        if type(reply) is BatchDone and isinstance(reply.payload, StorePayload):
            return Received(remote.worker_id, reply, ObjectStoreBatch(reply.payload))
        return Received(remote.worker_id, reply)

    def _lost(self, remote: _Remote, failed: _Call, error: BaseException) -> list[PoolEvent]:
        """A worker lost: the replies it sent before are received, then its death (or,
        if its actor could not be created at all, a start-up failure). A worker that
        marked its start on the board started, even if its Ready was lost with it: a
        death in its first task is that task's, not a start-up death."""
        remote.lost = True
        events: list[PoolEvent] = []
        others = [c for c in remote.calls if c is not failed]
        settled: set[Any] = set()
        if others:  # Ray fails a lost actor's calls soon: wait for them, boundedly
            refs = [c.ref for c in others]
            with contextlib.suppress(Exception):
                settled = set(self._ray.wait(refs, num_returns=len(refs), timeout=SETTLE_S)[0])
        for call in others:
            if call.ref in settled:
                with contextlib.suppress(Exception):
                    events.append(self._received(remote, call, self._ray.get(call.ref)))
        if not remote.started:  # its Ready may have been lost with its process
            pid = self._board.started(remote.started_key)
            if pid is not None:  # it started (its state before any task is lost with it)
                remote.started, remote.pid = True, pid
                events.append(Received(remote.worker_id, Ready(remote.worker_id, pid)))
        running = next((c.task for c in remote.calls if c.task is not None), None)
        trace = self._board.read(remote.worker_id) if running and running.trace else None
        status = remote.status(time.monotonic(), trace)
        for call in remote.calls:
            self._waiting.pop(call.ref, None)
        remote.calls.clear()
        with contextlib.suppress(Exception):
            self._ray.kill(remote.actor, no_restart=True)  # unreachable is not dead: make it
        if failed.task is None and ray_cluster.is_startup_failure(error):
            events.append(Received(remote.worker_id, StartupFailed(Stage.STARTUP, capture(error))))
        else:
            cause = ray_cluster.describe_loss(error)
            events.append(Died(remote.worker_id, remote.pid, None, status, cause=cause))
        return events

    def _check_cluster(self) -> None:
        why = ray_cluster.unreachable()
        if why is None:
            return
        self._cluster_lost = True
        # Ray ends a process whose cluster stays unreachable for a minute; disconnected,
        # the training process lives on to save its state.
        with contextlib.suppress(Exception):
            self._ray.shutdown()
        raise ClusterLostError(
            f"The Ray cluster the DataLoader's workers run on can no longer be reached: "
            f"{why}. No batch can come from it. conveyor disconnected this process from Ray "
            "(ray.shutdown()), so that Ray does not end it. The batches handed out so far "
            "are in loader.state_dict(): save it, and resume with load_state_dict() once "
            "the cluster is back (or with worker_method='multiprocessing')."
        )

    # --- seeing into workers (Abilities.inspect) ----------------------------------------

    def pids(self) -> list[int | None]:
        return [remote.pid for remote in self._workers]

    def status(self, worker_id: int) -> WorkerStatus:
        remote = self._workers[worker_id]
        return GONE if remote.killed else remote.status(time.monotonic())

    def stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        return ""  # a busy actor answers nothing else, and its process may be far away

    # --- life and death -----------------------------------------------------------------

    def kill(self, worker_id: int) -> None:
        """End a stuck worker's actor: its calls then fail, and its death is received."""
        self._workers[worker_id].killed = True
        with contextlib.suppress(Exception):
            self._ray.kill(self._workers[worker_id].actor, no_restart=True)

    def restart(self, worker_id: int) -> None:
        """A new actor in place of a lost one: same id, same seed, same objects."""
        old = self._workers[worker_id]
        for call in old.calls:
            self._waiting.pop(call.ref, None)
        with contextlib.suppress(Exception):
            self._ray.kill(old.actor, no_restart=True)
        self._workers[worker_id] = self._launch(self._specs[worker_id])

    def close(self) -> None:
        """Cancel what was queued, let each worker finish its task and close its
        per_worker resources (STOP_GRACE_S at most), end every actor, and wait until Ray
        says each is gone. Safe to call twice; after the cluster was lost, nothing to do."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        if self._cluster_lost or not self._workers or not ray.is_initialized():
            return  # the actors went with the cluster, or with this process's Ray session
        with contextlib.suppress(Exception):
            live = [r for r in self._workers if not r.lost]
            for remote in live:
                for call in list(remote.calls)[1:]:  # queued, not begun
                    with contextlib.suppress(Exception):
                        ray.cancel(call.ref)
            stops = [remote.actor.stop.remote() for remote in live]
            if stops:
                ray.wait(stops, num_returns=len(stops), timeout=STOP_GRACE_S)
            for remote in self._workers:
                with contextlib.suppress(Exception):
                    ray.kill(remote.actor, no_restart=True)
            # A call to a killed actor fails once Ray has it dead: block until then.
            gone = [remote.actor.stop.remote() for remote in self._workers]
            ray.wait(gone, num_returns=len(gone), timeout=SETTLE_S)
        self._waiting.clear()
        self._board.clear()


def _raise_if_interrupted(exc: Exception) -> None:
    """A signal handler's exception that Ray reported as its own failure: the user's,
    raised as itself (see ray_cluster.interrupting_error)."""
    raised = ray_cluster.interrupting_error(exc)
    if raised is not None:
        raise raised from None
