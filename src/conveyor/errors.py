"""conveyor's exceptions.

Each class has one meaning, and each also subclasses the built-in exception a
torch user would already catch for that mistake, so ``except`` clauses written
for ``torch.utils.data.DataLoader`` keep working::

    ConveyorError
    ├── WorkerError (RuntimeError)            a worker died, hung, or failed to start
    │   ├── WorkerCrashedError                signal / exit code, likely cause, in-flight indices
    │   ├── WorkerTimeoutError (TimeoutError) a task outlived ``timeout``: index and stack
    │   ├── WorkerStartupError                the worker could not start (unpickling, import)
    │   └── ClusterLostError                  the Ray cluster of the workers cannot be reached
    ├── UnpicklableError (pickle.PicklingError, TypeError)
    │                                         what could not be pickled, as an attribute path
    ├── CollateError                          field path, dataset indices, shapes or key sets;
    │   ├── CollateKeyError (KeyError)        a sample lacks a key the first sample has
    │   ├── CollateShapeError (RuntimeError)  arrays / tensors of different shapes
    │   └── CollateTypeError (TypeError)      an element type collate cannot batch
    │       ├── CollateTypeRuntimeError (RuntimeError)  where torch raises RuntimeError
    │       │                                 (a None among arrays, sparse tensors)
    │       └── CollateTypeValueError (ValueError)  where torch raises ValueError
    ├── SharedMemoryExhaustedError (MemoryError)  no memory for a batch's slot: the size
    └── ConfigError (ValueError)              an argument and its bad value
        ├── PrefetchFactorError (AssertionError)  prefetch_factor=0 with workers (torch asserts)
        ├── MissingDependencyError (ImportError)  an option needs a package: the pip line
        ├── StateError                        a state_dict that cannot be loaded: the key, why
        │   └── WorkerCountError (AssertionError)  resuming per-worker state with another
        │                                     num_workers (torchdata asserts)
        └── UsageError                        ``conveyor doctor MODULE:OBJECT`` names nothing
                                              it can load (exit status 2)

Warnings (the loader keeps going)::

    ConveyorWarning (RuntimeWarning)
    ├── WorkerRestartedWarning                a worker died; it was replaced and its tasks re-sent
    ├── WorkerStallWarning                    a task runs far longer than usual: its stack
    ├── BatchesHeldWarning                    the user holds every shared-memory slot: copying now
    ├── PreflightWarning                      a hazard found before the workers started: the fix
    ├── ClusterCapacityWarning                Ray workers the whole cluster cannot hold: they wait
    ├── DuplicateDataWarning                  every rank, or every worker, would see the same data
    └── LoaderReplacedWarning                 accelerate's prepare() puts torch's loader in
                                              place of conveyor's: the one-line fix

Exceptions raised by *user code* (``__getitem__``, ``collate_fn``, ``worker_init_fn``...),
in a worker or in the main process (``num_workers=0``), are not wrapped: they are raised
with their own type, carrying a :class:`WorkerContext` that names the batch and, where
conveyor can tell, the sample that raised (a :class:`Culprit`); see
:func:`attach_worker_context`.

Messages say what happened, where, why, and how to fix it, in that order.
"""

from __future__ import annotations

import pickle
from typing import Any

# What conveyor adds to a user's own exception is no exception of its own: it lives in
# _task/context.py, and is importable from here as it always was.
from conveyor._task.context import Culprit, WorkerContext, add_note, attach_worker_context

__all__ = [
    "BatchesHeldWarning",
    "ClusterCapacityWarning",
    "ClusterLostError",
    "CollateError",
    "CollateKeyError",
    "CollateShapeError",
    "CollateTypeError",
    "CollateTypeRuntimeError",
    "CollateTypeValueError",
    "ConfigError",
    "ConveyorError",
    "ConveyorWarning",
    "Culprit",
    "DuplicateDataWarning",
    "LoaderReplacedWarning",
    "MissingDependencyError",
    "PrefetchFactorError",
    "PreflightWarning",
    "SharedMemoryExhaustedError",
    "StateError",
    "UnpicklableError",
    "UsageError",
    "WorkerContext",
    "WorkerCountError",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerRestartedWarning",
    "WorkerStallWarning",
    "WorkerStartupError",
    "WorkerTimeoutError",
    "add_note",
    "attach_worker_context",
]


class ConveyorWarning(RuntimeWarning):
    """Base class of conveyor's warnings: something went wrong and was handled."""


class WorkerRestartedWarning(ConveyorWarning):
    """A worker died and was replaced; its tasks were re-sent, nothing was lost."""


class WorkerStallWarning(ConveyorWarning):
    """A task has been running far longer than usual; the message has its stack."""


class BatchesHeldWarning(ConveyorWarning):
    """Every shared-memory slot of a worker is held by live batches: copying instead."""


class PreflightWarning(ConveyorWarning):
    """A pre-flight check found a hazard before the workers started (a handle forked
    workers would share, a huge list each worker copies...). ``finding`` has its details.
    """

    finding: Any = None  #: the :class:`~conveyor.Finding`: code, severity, where, what, why, fix


class ClusterCapacityWarning(ConveyorWarning):
    """Ray workers ask for more than the whole cluster has (CPUs, custom resources):
    those that do not fit wait until nodes join. The message says what each asks for,
    what the cluster has, and what to change."""


class DuplicateDataWarning(ConveyorWarning):
    """Data would be seen several times over without an error: ``torch.distributed``
    runs several ranks but the sampler does not shard, or an iterable dataset's
    workers all produce the same stream (torch says nothing in either case)."""


class LoaderReplacedWarning(ConveyorWarning):
    """A framework is replacing the conveyor loader with a torch ``DataLoader`` built from
    its attributes (accelerate's ``Accelerator.prepare``): torch's workers will load the
    data, and conveyor's options are gone. The message names the one-line fix."""


class ConveyorError(Exception):
    """Base class of every exception conveyor raises on its own account."""


class SharedMemoryExhaustedError(ConveyorError, MemoryError):
    """The system could not provide the shared memory a batch needs."""


class WorkerError(ConveyorError, RuntimeError):
    """A worker process died, hung, or could not start."""


class _NamesWorker(WorkerError):
    """A worker error that also carries, as attributes, which worker and indices."""

    _facts: tuple[str, ...] = ("worker_id", "pid", "indices")

    def __init__(
        self,
        message: str,
        *,
        worker_id: int | None = None,
        pid: int | None = None,
        indices: tuple[Any, ...] = (),
        **more: Any,
    ) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.indices = indices
        for name, value in more.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        facts = {name: getattr(self, name) for name in self._facts}
        return (_rebuild_with_kwargs, (type(self), self.args, facts))


class WorkerCrashedError(_NamesWorker):
    """A worker process exited without being asked to (a signal or an exit code).

    The message names the signal or exit code, its likely cause (the OOM killer, a
    crash in native code), the worker and the dataset indices it held. The same facts
    are attributes: ``worker_id``, ``pid`` and ``indices`` (None or empty where unknown),
    and ``exitcode``.
    """

    _facts = (*_NamesWorker._facts, "exitcode")
    #: the process's exit code, negative for a signal (-9: SIGKILL); None: its kind of
    #: worker cannot say (a Ray actor)
    exitcode: int | None = None


class WorkerTimeoutError(_NamesWorker, TimeoutError):
    """A task took longer than the loader's ``timeout``. The message has the worker's
    Python stack; ``worker_id``, ``pid`` and ``indices`` (the dataset indices of the
    stuck batch) are attributes."""


class WorkerStartupError(WorkerError):
    """A worker could not start: its arguments did not unpickle, or an import failed."""


class ClusterLostError(WorkerError):
    """The Ray cluster the workers run on can no longer be reached (its head node is
    gone, or this process lost its connection): no task can finish. What was handed
    out is in ``state_dict()``, to resume from once the cluster is back."""


class UnpicklableError(ConveyorError, pickle.PicklingError, TypeError):
    """Something that must cross a process boundary cannot be pickled.

    ``path`` names it from a root the user knows (``dataset.db.connection`` or
    ``sample['meta']['fh']``) and ``type_name`` says what it is.
    """

    def __init__(self, message: str, *, path: str = "", type_name: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.type_name = type_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_with_kwargs,
            (type(self), self.args, {"path": self.path, "type_name": self.type_name}),
        )


class CollateError(ConveyorError):
    """Samples could not be combined into a batch.

    ``path`` is the field inside the sample (``['image']`` or ``[1]``), empty
    for the sample itself; ``indices`` are the dataset indices of the batch, and
    ``culprits`` those of the samples at fault, when only some are (a missing key,
    another shape or type than most samples have).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        indices: tuple[Any, ...] = (),
        culprits: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(message)
        self.path = path
        self.indices = indices
        self.culprits = culprits

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message; show it as written.
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_with_kwargs,
            (
                type(self),
                self.args,
                {"path": self.path, "indices": self.indices, "culprits": self.culprits},
            ),
        )


class CollateKeyError(CollateError, KeyError):
    """A sample lacks a key that another sample of the batch has."""


class CollateShapeError(CollateError, RuntimeError):
    """Arrays or tensors of one field have different shapes within a batch."""


class CollateTypeError(CollateError, TypeError):
    """A sample holds a type that collate does not know how to batch."""


class CollateTypeRuntimeError(CollateTypeError, RuntimeError):
    """A collate type error where torch raises ``RuntimeError`` (a value torch cannot make
    a tensor of, such as a None among arrays; sparse or nested tensors)."""


class CollateTypeValueError(CollateTypeError, ValueError):
    """A collate type error where torch raises ``ValueError``."""


class ConfigError(ConveyorError, ValueError):
    """An argument has a value that conveyor cannot work with."""


class PrefetchFactorError(ConfigError, AssertionError):
    """``prefetch_factor=0`` with workers: torch raises AssertionError on ``iter()``."""


class MissingDependencyError(ConfigError, ImportError):
    """An option needs a package that is not installed (``worker_method="ray"`` needs
    Ray): the message says which, and the line that installs it."""


class StateError(ConfigError):
    """``load_state_dict`` got a state it cannot resume from: the message names the key
    and what was expected (a malformed state, an unknown version, another dataset)."""


class WorkerCountError(StateError, AssertionError):
    """A state holding per-worker state (an iterable dataset, a dataset with its own
    ``state_dict``) was loaded into a loader with another ``num_workers``; raised at
    ``iter()``. An AssertionError too, as torchdata's ``StatefulDataLoader`` raises."""


class UsageError(ConfigError):
    """``conveyor doctor MODULE:OBJECT``: the argument does not name something doctor can
    load (no such module or object, its import failed, not a dataset); exit status 2."""


def _rebuild_with_kwargs(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return cls(*args, **kwargs)
