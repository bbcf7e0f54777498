"""The kinds of worker, as values: what each is, how its pool is made, and what the rest
of the loader asks of it.

A kind is a shell around :class:`~.core.WorkerCore` and a pool that speaks api.py's
protocol. The face, the pre-flight, autotune and the iterators ask a
:class:`WorkerKind` (does it start processes, pickle the user's objects, make tensors
in the main process...) as they ask a :class:`~.start_method.StartMethod`: nothing
outside this module compares kind names. A new kind is its shell, its pool and one
:func:`register` (tests/helpers/fake_kind.py registers the loop's fake pool so).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._transport.budget import SlotBudget
from ..errors import ConfigError
from .api import PoolFactory
from .pool import WorkerPool
from .ray_cluster import check_actor_options, require_ray
from .start_method import StartMethod
from .threads import ThreadPool

__all__ = [
    "MULTIPROCESSING",
    "RAY",
    "THREAD",
    "KindConfig",
    "WorkerKind",
    "find",
    "named",
    "names",
    "register",
    "unregister",
]


class KindOptions(Protocol):
    """What making a kind's pool reads of conveyor's own options (config.Options)."""

    @property
    def worker_options(self) -> Mapping[str, Any] | None: ...
    @property
    def threads_per_worker(self) -> int: ...
    @property
    def run_ahead(self) -> bool: ...


class KindConfig(Protocol):
    """What making a kind's pool reads of a loader's config (config.LoaderConfig)."""

    @property
    def start_method(self) -> StartMethod: ...
    @property
    def timeout(self) -> float: ...
    @property
    def prefetch(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def options(self) -> KindOptions: ...


def _always() -> None:
    """A kind that needs nothing installed."""


@dataclass(frozen=True)
class WorkerKind:
    """One kind of worker (see the module docstring)."""

    name: str  # the ``worker_method`` that names it; what get_worker_info() says
    description: str  # where it runs each worker, in words (the error naming the kinds)
    pool: Callable[[KindConfig], PoolFactory]
    # Worker processes of this machine, started by multiprocessing: a start method
    # applies, each takes a CPU and descriptors, and one may run several cores in threads.
    starts_processes: bool = False
    # Threads of the training process: nothing is pickled or forked, the workers share
    # its objects (and its generators: the pre-flight looks for what that breaks).
    in_this_process: bool = False
    # The user's objects reach the workers pickled whatever the start method (None: as
    # the start method says, or never in this process).
    always_pickled: bool = False
    # The main process makes the batch's tensors (the workers defer torch: _torch.py).
    tensors_in_main: bool = True
    # iter() runs the cheap pre-flight first (a kind whose start pickles the objects
    # names what does not pickle itself).
    automatic_preflight: bool = True
    # Why multiprocessing_context means nothing with it ("": it means what it says).
    no_start_method: str = ""
    # Its check of worker_options (None: it takes none).
    check_options: Callable[[Mapping[str, Any]], None] | None = None
    # Raises, saying what to install, when what it needs is missing.
    require: Callable[[], None] = _always

    @property
    def local(self) -> bool:
        """Its workers run on this machine (their count can be sized to its CPUs)."""
        return self.starts_processes or self.in_this_process

    def pickles_objects(self, start_method: StartMethod) -> bool:
        """Whether the dataset, collate_fn and worker_init_fn reach the workers pickled."""
        if self.in_this_process:
            return False
        return self.always_pickled or start_method.pickles_objects

    def refuse_options(self, options: Mapping[str, Any] | None) -> None:
        """``worker_options`` it cannot take (a ConfigError saying why)."""
        if options is None:
            return
        if self.check_options is None:
            raise ConfigError(
                f"worker_options={options!r} are Ray actor options: they need "
                f"worker_method='ray', got worker_method={self.name!r}. Drop worker_options, "
                "or pass worker_method='ray'."
            )
        self.check_options(options)

    def refuse_cores(self, threads_per_worker: int) -> None:
        """``threads_per_worker`` above 1 runs cores in threads of worker processes."""
        if threads_per_worker > 1 and not self.starts_processes:
            raise ConfigError(
                f"threads_per_worker={threads_per_worker} runs threads inside worker "
                f"processes, but worker_method={self.name!r} starts no worker process. Use "
                "worker_method='multiprocessing' with it, or drop it (with "
                "worker_method='thread', num_workers is the number of threads)."
            )

    def refuse_start_method(self, context: object) -> None:
        """A ``multiprocessing_context`` given where it means nothing."""
        if context is not None and self.no_start_method:
            raise ConfigError(
                f"multiprocessing_context={context!r} has no meaning with "
                f"worker_method={self.name!r}: {self.no_start_method}. Drop one of them."
            )


def _processes(config: KindConfig) -> PoolFactory:
    options = config.options
    slots = SlotBudget.for_loader(config.prefetch, config.num_workers, options.run_ahead)
    return functools.partial(
        WorkerPool,
        start_method=config.start_method,
        threads_per_worker=options.threads_per_worker,
        slots=slots,
    )


def _threads(config: KindConfig) -> PoolFactory:
    return functools.partial(ThreadPool, timeout=config.timeout)


def _ray(config: KindConfig) -> PoolFactory:
    from .ray_pool import RayPool  # Ray itself is imported when the pool starts

    return functools.partial(RayPool, options=config.options.worker_options)


MULTIPROCESSING = WorkerKind(
    "multiprocessing",
    "runs each worker in a process (torch's default)",
    _processes,
    starts_processes=True,
)
THREAD = WorkerKind(
    "thread",
    "in a thread of this process",
    _threads,
    in_this_process=True,
    tensors_in_main=False,
    no_start_method="thread workers start no process",
)
RAY = WorkerKind(
    "ray",
    "in an actor on a Ray cluster",
    _ray,
    always_pickled=True,
    # Its pool pickles the objects as it starts, which names what does not pickle.
    automatic_preflight=False,
    no_start_method="Ray starts its workers' processes on the cluster's nodes",
    check_options=check_actor_options,
    require=require_ray,
)

_KINDS: dict[str, WorkerKind] = {kind.name: kind for kind in (MULTIPROCESSING, THREAD, RAY)}


def find(name: object) -> WorkerKind | None:
    """The kind ``name`` names, if any."""
    return _KINDS.get(name) if isinstance(name, str) else None


def names() -> tuple[str, ...]:
    """The names of the kinds a loader can name."""
    return tuple(_KINDS)


def named(name: object) -> WorkerKind:
    """The kind ``name`` names; a ConfigError listing the kinds if none."""
    kind = find(name)
    if kind is None:
        kinds = ", ".join(f"{k.name!r} {k.description}" for k in _KINDS.values())
        raise ConfigError(f"worker_method must be one of {names()}, got {name!r}: {kinds}")
    return kind


def register(kind: WorkerKind) -> None:
    """Make ``kind`` one a loader can name (``worker_method=kind.name``)."""
    if kind.name in _KINDS:
        raise ValueError(f"a kind of worker named {kind.name!r} is registered already")
    _KINDS[kind.name] = kind


def unregister(name: str) -> None:
    """Forget a kind :func:`register` added (the three built in stay)."""
    if name in (MULTIPROCESSING.name, THREAD.name, RAY.name):
        raise ValueError(f"{name!r} is built in")
    _KINDS.pop(name, None)
