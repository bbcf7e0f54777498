"""What the shell of every kind of worker gives the core it runs: who the worker is and
what it serves (:class:`WorkerSpec`), the user's objects (:class:`UserObjects`), and
what the core works against: an inbox, an outbox, a status sink and a transport (in the
training thread, ``num_workers=0``: :data:`IN_PLACE` and :data:`UNWATCHED`, nothing sent
and nobody reading)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from .._task.compat import assert_never
from .._task.dataset_calls import DatasetCall, detach
from .._task.protocol import EpochMessage, MainMessage, ReplayCalls, SeedPipe, Stage, WorkerMessage
from .._task.supervision import SupervisionPolicy
from .._torch import datapipes as _datapipes
from ..collate import Registrations

__all__ = [
    "IN_PLACE",
    "UNWATCHED",
    "Inbox",
    "Outbox",
    "SpecSource",
    "StatusSink",
    "Transport",
    "UserObjects",
    "WorkerSpec",
    "own_objects",
]


@dataclass(frozen=True)
class UserObjects:
    """What the user gave us that runs in the worker."""

    dataset: Any
    collate_fn: Callable[[Any], Any]
    worker_init_fn: Callable[[int], Any] | None
    # The collate registries as the main process had them at iter() (None: defaults
    # only): a worker process that does not run __main__ gets them from here (loop.py).
    collate_registrations: Registrations | None = None


class _Reseeding(Protocol):
    @property
    def reseed(self) -> str: ...


class SpecSource(Protocol):
    """What a worker's spec is made from (a loader's config.LoaderConfig)."""

    @property
    def num_workers(self) -> int: ...
    @property
    def iterable(self) -> bool: ...
    @property
    def auto_collation(self) -> bool: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def policy(self) -> SupervisionPolicy: ...
    @property
    def tensors_in_main(self) -> bool: ...
    @property
    def state_per_worker(self) -> bool: ...
    @property
    def info_method(self) -> str: ...
    @property
    def options(self) -> _Reseeding: ...


@dataclass(frozen=True)
class WorkerSpec:
    """Who a worker is and what it serves, whatever kind of worker runs it (the memory a
    kind gives it is that kind's own business)."""

    worker_id: int
    num_workers: int
    base_seed: int
    iterable: bool
    auto_collation: bool
    drop_last: bool
    skip_errors: bool = False  # on_error="skip": leave failing samples out
    tensors_in_main: bool = False  # the main process makes the tensors (see _torch.py)
    reseed: str = "worker"  # see conveyor.sampling._reseed
    report_state: bool = False  # the dataset keeps a state: report it (Ready, replies)
    resume_state: bytes | None = None  # a pickled WorkerState to restore at start-up
    new_epoch_first: bool = False  # that state is an ended epoch's: the first task starts anew
    pipe_seed: int | None = None  # an IterDataPipe dataset: its shared seed (_datapipes)
    # The training loop's calls on the main process's dataset (set_epoch...), made on the
    # worker's copy before anything else: a replacement's copy may be older than they are.
    calls: tuple[DatasetCall, ...] = ()
    worker_method: str = "multiprocessing"  # what get_worker_info() says

    @classmethod
    def for_worker(
        cls, config: SpecSource, worker_id: int, base_seed: int, **start: Any
    ) -> WorkerSpec:
        """Worker ``worker_id``'s spec under a loader's ``config``, drawn ``base_seed``;
        ``start``: where it starts from (a saved state, a DataPipe's seed...)."""
        return cls(
            worker_id=worker_id,
            num_workers=config.num_workers,
            base_seed=base_seed,
            iterable=config.iterable,
            auto_collation=config.auto_collation,
            drop_last=config.drop_last,
            skip_errors=config.policy.skipping,
            tensors_in_main=config.tensors_in_main,
            reseed=config.options.reseed,
            report_state=config.state_per_worker,
            worker_method=config.info_method,
            **start,
        )

    def keeping(self, message: EpochMessage) -> WorkerSpec:
        """This spec, for a worker started in place of one that was sent ``message``
        (as an epoch started): it starts where that one was."""
        match message:
            case SeedPipe(seed=seed):
                return dataclasses.replace(self, pipe_seed=seed)
            case ReplayCalls(calls=calls):
                return dataclasses.replace(self, calls=calls)
            case _:
                assert_never(message)


def own_objects(user: UserObjects) -> UserObjects:
    """A core's objects when it shares its process with other cores (threads): a dataset
    of its own, as a process worker has, so what ``worker_init_fn`` or ``__iter__`` sets
    on it (``dataset.start = ...``, an iterator) is this core's. A shallow copy: the data
    it holds (lists, arrays, files) is shared, not copied, and the calls conveyor records
    for the workers (set_epoch...) are not (see _task.dataset_calls.detach). A dataset
    that cannot be copied is shared."""
    dataset = user.dataset
    with contextlib.suppress(Exception):
        # A DataPipe graph is sharded per worker in place: each needs the whole graph.
        if _datapipes.is_datapipe(dataset):
            dataset = copy.deepcopy(dataset)
        else:
            dataset = detach(copy.copy(dataset))
    return dataclasses.replace(user, dataset=dataset)


class Inbox(Protocol):
    def recv(self) -> MainMessage:
        """The next message; blocks. EOFError (or OSError) once the main side is gone."""
        ...


class Outbox(Protocol):
    def send(self, message: WorkerMessage) -> None:
        """Raises BrokenPipeError (or OSError) once the main side is gone."""
        ...


class StatusSink(Protocol):
    """Where the core says what it is doing (a process worker's status page)."""

    def begin(self, epoch: int, seq: int) -> None: ...
    def stage(self, stage: Stage) -> None: ...
    def position(self, position: int) -> None: ...
    def idle(self) -> None: ...
    def stop_requested(self) -> bool: ...

    @property
    def stop_check(self) -> Callable[[], object] | None: ...  # the same, before each sample


class Transport(Protocol):
    """How a collated batch leaves the core (see conveyor._transport.codec.Encoder)."""

    arrays_as_tensors: bool  # set by the core: NumPy leaves that stand for tensors

    def collating(self) -> AbstractContextManager[Any]:
        """Entered while collate runs: where stacked arrays are written."""
        ...

    def encode(self, batch: Any) -> Any:
        """The payload for ``batch``; raises what pickling raises."""
        ...


# --- what the training thread's core (num_workers=0) works against -----------------


class InPlace:
    """The training thread's transport: collate writes where it likes, nothing is sent."""

    arrays_as_tensors = False

    def collating(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def encode(self, batch: Any) -> Any:
        raise AssertionError("the training thread's batches are not sent")


class Unwatched:
    """The training thread's status: nobody reads it."""

    def begin(self, epoch: int, seq: int) -> None:
        pass

    def stage(self, stage: Stage) -> None:
        pass

    def position(self, position: int) -> None:
        pass

    def idle(self) -> None:
        pass

    def stop_requested(self) -> bool:
        return False

    stop_check = None


IN_PLACE = InPlace()
UNWATCHED = Unwatched()
