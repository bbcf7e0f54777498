"""What the loop and its workers say to each other, whatever kind the workers are.

The main process sends :class:`Task`, :class:`Stop`, and as an epoch starts
:class:`ReplayCalls` (the dataset's ``set_epoch``...) and (DataPipes) :class:`SeedPipe`; a
worker answers each task with exactly one of :class:`BatchDone`, :class:`TaskFailed` or
:class:`IterationEnded`, and says :class:`Ready` (or :class:`StartupFailed`) once after
start-up. What a worker is doing (:class:`WorkerStatus`) and how it ended (:class:`Died`)
are told in the same words to the loop's judges, which therefore import no worker
machinery: this module is shared by both sides, as ``_task/runner.py`` is.

Messages are frozen dataclasses without __slots__: those unpickle in C, twice as
fast as slotted ones, which matters at thousands of batches per second.

A task is named by ``(epoch, seq)``: its position in the epoch's batch order.
Everything exact (ordering, re-sending after a crash, discarding results of an
abandoned epoch) is bookkeeping on those two numbers in the main process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from conveyor.errors import Culprit

from .dataset_calls import DatasetCall

_T = TypeVar("_T")


def builder(cls: type[_T]) -> Callable[..., _T]:
    """Makes a message from keyword fields without calling its ``__init__``, which sets
    each field through ``object.__setattr__`` (frozen): the fields given, the others their
    defaults. For the messages made once per batch (a task, a batch's reply): a third of
    their cost."""
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is not dataclasses.MISSING
    }
    new = object.__new__

    def build(**fields: Any) -> _T:
        made = new(cls)
        made.__dict__.update(defaults, **fields)
        return made

    return build


class Stage(str, Enum):
    """What a worker was doing when something went wrong."""

    STARTUP = "startup"  # unpickling the dataset, importing
    WORKER_INIT = "worker_init"  # the user's worker_init_fn
    FETCH = "fetch"  # dataset[i], __getitems__, next(iterator)
    COLLATE = "collate"  # collate_fn
    TRANSFER = "transfer"  # encoding the batch to send it back
    DECODE = "decode"  # rebuilding the batch in the main process


# --- main process -> worker -------------------------------------------------


@dataclass(frozen=True)
class Task:
    """Fetch and collate one batch.

    ``index`` is what the sampler produced: a list of dataset indices (automatic
    batching), a single index (``batch_size=None``), or for iterable-style
    datasets the batch sampler's placeholder list (only its length matters).
    """

    epoch: int
    seq: int
    index: Any
    trace: bool = False  # a retry after a crash: record which sample is being fetched
    exclude: tuple[Any, ...] = ()  # dataset indices to leave out (samples that kill workers)
    first_sample: int = 0  # the position of its first sample in the epoch (reseed="sample")
    want_state: bool = False  # reply with the dataset's state after this task
    # ``index`` is ``list(range(index[0], index[0] + len(index)))`` (a sequential
    # sampler's batch): it travels as two numbers instead of a pickled list.
    consecutive: bool = False
    # Ranks that shard the epoch, reseed="sample": each sample's place in the whole
    # epoch's order, which it is seeded by instead of its position on this rank.
    places: tuple[int, ...] = ()


@dataclass(frozen=True)
class Stop:
    """Finish: exit the worker loop and release everything."""


@dataclass(frozen=True)
class SeedPipe:
    """A DataPipe dataset's shared seed for the next epoch (persistent workers): seed
    its random parts with it before that epoch's first task (see conveyor._torch.datapipes)."""

    seed: int


@dataclass(frozen=True)
class ReplayCalls:
    """Calls the training loop made on the main process's dataset since the workers
    last heard (``set_epoch(epoch)``, or a method the loader's ``epoch_calls`` names):
    make them on the worker's copy before the next epoch's first task, and so before an
    iterable dataset's iterator is made (see conveyor._task.dataset_calls)."""

    calls: tuple[DatasetCall, ...]


# What a replacement worker starts with too (see WorkerSpec.keeping): sent as an epoch
# starts, before its tasks.
EpochMessage = SeedPipe | ReplayCalls


# --- worker -> main process -------------------------------------------------


@dataclass(frozen=True)
class Ready:
    worker_id: int
    pid: int
    state: bytes | None = None  # the dataset's state before any task (pickled WorkerState)


@dataclass(frozen=True)
class BatchDone:
    epoch: int
    seq: int
    payload: Any  # a transport payload (conveyor._transport.codec); None: nothing left
    skipped: tuple[SampleFailed, ...] = ()
    busy_s: float = 0.0  # the worker's own time on this task, start to reply
    # Where that time went (statistics and trace): when the task began on the worker's
    # monotonic clock, and its fetch (__getitem__/__getitems__), collate and encode.
    started: float = 0.0
    fetch_s: float = 0.0
    collate_s: float = 0.0
    encode_s: float = 0.0
    state: bytes | None = None  # the dataset's state after it (Task.want_state)
    epoch_state: bytes | None = None  # its state when this epoch began (first task only)
    asked_worker_info: bool | None = None  # iterable datasets, first batch of an epoch


@dataclass(frozen=True)
class IterationEnded:
    """An iterable-style dataset's iterator in this worker is exhausted."""

    epoch: int
    seq: int
    state: bytes | None = None
    epoch_state: bytes | None = None


@dataclass(frozen=True)
class RemoteError:
    """An exception raised in a worker, in a form that survives the trip.

    ``pickled`` is the exception itself when it could be pickled; the other
    fields let the main process rebuild it (same type) when unpickling fails,
    e.g. for classes whose ``__init__`` takes unusual arguments.
    """

    pickled: bytes | None
    module: str
    qualname: str
    args: bytes | None
    state: bytes | None
    message: str
    traceback: str


@dataclass(frozen=True)
class SampleFailed:
    """One sample left out of a batch under ``on_error="skip"``."""

    index: Any
    stage: Stage
    error: RemoteError


@dataclass(frozen=True)
class TaskFailed:
    epoch: int
    seq: int
    stage: Stage
    error: RemoteError
    state: bytes | None = None
    epoch_state: bytes | None = None
    culprit: Culprit | None = None  # which sample raised, where the worker can tell


@dataclass(frozen=True)
class StartupFailed:
    stage: Stage
    error: RemoteError


MainMessage = Task | Stop | SeedPipe | ReplayCalls
WorkerMessage = Ready | BatchDone | IterationEnded | TaskFailed | StartupFailed
TaskReply = BatchDone | TaskFailed | IterationEnded  # exactly one per task


# --- what the loop knows of a worker ------------------------------------------------


@dataclass(frozen=True)
class WorkerStatus:
    """What a worker is doing, as its status page (or sink) says."""

    epoch: int
    seq: int
    stage: Stage | None  # None: between tasks
    position: int
    age_s: float  # since the task began; between tasks, since the worker went idle
    thread: int = 0  # the core's thread, when it shares its process (0: not said)
    native_id: int = 0


# What a worker that is gone reads as until it is replaced (retired, killed, abandoned):
# idle since now, so no deadline ever counts against it.
GONE = WorkerStatus(-1, -1, None, -1, 0.0)


@dataclass(frozen=True)
class Own:
    """The death was this worker's own doing: its process ran it alone, or its thread
    crashed the process, or the loop killed the process for it. ``siblings``: the other
    workers of its process (threads_per_worker), ended and restarted with it."""

    siblings: tuple[int, ...] = ()


@dataclass(frozen=True)
class Bystander:
    """It ended with its process, which worker ``of`` (a thread of the same process)
    ended: no evidence against what it ran, and no restart charged."""

    of: int


@dataclass(frozen=True)
class Unknown:
    """It ended with its process and nothing says which worker's doing it was (a kill
    from outside): evidence against what each of them ran, but the process's death is
    charged once, to one of them (``charged``)."""

    siblings: tuple[int, ...]
    charged: bool


Blame = Own | Bystander | Unknown


@dataclass(frozen=True)
class Died:
    """A worker exited without being asked to (its messages came first).

    ``exitcode`` None: how it ended is not known (a Ray actor's process: Ray does not say
    whether it crashed or was killed), which is weak evidence against its sample, as a
    kill from outside is. ``cause`` then says what is known, in words. ``blame``: whose
    doing the death was, when the worker shared its process with others."""

    worker_id: int
    pid: int | None
    exitcode: int | None
    status: WorkerStatus  # what it was doing, read after it died
    cause: str | None = None
    blame: Blame = Own()

    @property
    def charged(self) -> bool:
        """It counts against max_worker_restarts: once per process death."""
        blame = self.blame
        return blame.charged if isinstance(blame, Unknown) else isinstance(blame, Own)

    @property
    def siblings(self) -> tuple[int, ...]:
        """The other workers of its process, ended with it."""
        return () if isinstance(self.blame, Bystander) else self.blame.siblings


@dataclass(frozen=True)
class Busy:
    """A worker as its status page tells now: running a task, or idle."""

    worker_id: int
    pid: int | None
    status: WorkerStatus


# --- how far workers may run ahead (a pool's answer, see _iter/run_ahead.py) ----------

# Batches the training loop may keep alive beyond ``prefetch_factor`` before a worker's
# batches stop finding room in its memory (process workers: slots) and come another way.
HELD_BEYOND_PREFETCH = 4


@dataclass(frozen=True)
class RoomAhead:
    """What a pool tells of a batch it received, for the run-ahead of small, quick
    batches: ``extra`` tasks beyond ``prefetch_factor`` each worker may take for batches
    that take ``size`` bytes of its memory; or (``full``) that every piece of that memory
    was in use, so the batch came another way: ``held_in_worker`` pieces held by arrays
    the worker keeps, ``held_by_loop`` batches handed out and still alive."""

    size: int = 0
    extra: int = 0
    full: bool = False
    held_in_worker: int = 0
    held_by_loop: int = 0
