"""A remote worker, as it runs on the Ray cluster: an actor around a WorkerCore.

One actor per worker. Ray runs its calls one at a time, in the order the driver made
them, so the actor is the core's inbox and each call's return value its outbox. It
owns its process, as a process worker does: the core seeds the process's generators as
torch's workers are seeded and makes torch use one thread. Like a spawned worker it
defers importing torch until the user's objects or a batch need it (the driver then
makes the tensors): importing it costs each actor seconds (see
ray_cluster.actor_class). Nothing it does raises into Ray: what goes wrong in the
user's code comes back as a value, with its stage (see core.py).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from .._task.protocol import MainMessage, Ready, Stage, StartupFailed
from .._transport.object_store import ObjectStoreEncoder
from .core import WorkerCore
from .ray_cluster import TraceBoard
from .remote_error import capture
from .spec import WorkerSpec

__all__ = ["ConveyorWorker"]


class _TraceStatus:
    """The core's status sink. Nothing is written for a task as it runs (the driver
    knows which one runs: the oldest it has not heard back from); a traced retry's
    positions go to the cluster's key-value store (see ray_cluster.TraceBoard)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._task = (-1, -1)

    def begin(self, epoch: int, seq: int) -> None:
        self._task = (epoch, seq)

    def stage(self, stage: Stage) -> None:
        pass

    def position(self, position: int) -> None:  # called before each sample of a traced task
        TraceBoard.write(self._key, *self._task, position)

    def idle(self) -> None:
        pass

    def stop_requested(self) -> bool:
        return False  # the driver cancels what it no longer wants (see RayPool.close)

    stop_check = None


class ConveyorWorker:
    """The actor. ``user`` is the user's objects, cloudpickled once by the driver and
    put in the object store as bytes every worker reads in place."""

    def __init__(
        self, spec: WorkerSpec, user: np.ndarray, trace_key: bytes, started_key: bytes
    ) -> None:
        self._spec = spec
        self._user = user
        self._trace_key = trace_key
        self._started_key = started_key
        self._core: WorkerCore | None = None

    def start(self) -> Ready | StartupFailed:
        """Load the user's objects, seed, run worker_init_fn: the core's first message."""
        try:
            user = pickle.loads(self._user.data)  # the store's memory, in place
        except BaseException as exc:
            return StartupFailed(Stage.STARTUP, capture(exc))
        finally:
            self._user = None  # type: ignore[assignment]
        status = _TraceStatus(self._trace_key)
        transport = ObjectStoreEncoder()
        self._core = WorkerCore(self._spec, user, transport, status, owns_process=True)
        reply = self._core.start()
        if isinstance(reply, Ready):
            TraceBoard.mark_started(self._started_key, reply.pid)
        return reply

    def handle(self, message: MainMessage) -> Any:
        """A task's reply, or None (a DataPipe's seed)."""
        assert self._core is not None, "start() first"
        return self._core.handle(message)

    def stop(self) -> None:
        """Close what the dataset opened with ``conveyor.per_worker``; the driver then
        ends the actor."""
        if self._core is not None:
            self._core.close()

    def __repr__(self) -> str:  # how Ray names the actor in its messages and logs
        return f"conveyor worker {self._spec.worker_id}"
