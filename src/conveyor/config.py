"""What a loader was asked to do, as frozen values.

``DataLoader.__init__`` validates torch's arguments and conveyor's own, then
builds one :class:`LoaderConfig`. The iterators, the pre-flight checks and
``doctor`` read that value and never the ``DataLoader`` itself, so none of
them imports ``loader.py``. What a loader accumulates across epochs lives in
:class:`LoaderHistory`, passed explicitly beside the config.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any

from ._reseed import check_reseed
from .errors import ConfigError
from .records import LoaderStatistics, SkippedSample
from .stateful import is_stateful

if TYPE_CHECKING:
    from .observe.autotune import Autotuner
    from .observe.trace import Tracer

__all__ = [
    "WORKER_METHODS",
    "LoaderConfig",
    "LoaderHistory",
    "Options",
    "StartMethod",
    "SupervisionPolicy",
]

ON_ERROR = ("raise", "skip")
WORKER_METHODS = ("multiprocessing", "thread", "ray")
ON_TIMEOUT = ("raise", "restart")


@dataclass(frozen=True)
class StartMethod:
    """How worker processes start, and what follows from it.

    Answers the questions the code used to ask by comparing strings: does the
    child get the parent's memory as it is, must the user's objects be pickled
    to reach it, is a fork server involved.
    """

    name: str  # "fork", "spawn" or "forkserver"

    @classmethod
    def of(cls, context: str | BaseContext | None) -> StartMethod:
        """The start method ``context`` names (None: the platform's default),
        without fixing multiprocessing's global default as a side effect."""
        if isinstance(context, BaseContext):
            return cls(context.get_start_method())
        methods = multiprocessing.get_all_start_methods()
        if context is None:
            # The first of get_all_start_methods() is the platform's default (documented).
            return cls(multiprocessing.get_start_method(allow_none=True) or methods[0])
        if context not in methods:
            raise ConfigError(
                f"multiprocessing_context should be one of {methods}, got {context!r}"
            )
        return cls(context)

    @property
    def copies_memory(self) -> bool:
        """The child starts as a copy of this process: handles and globals are shared."""
        return self.name == "fork"

    @property
    def pickles_objects(self) -> bool:
        """The dataset, collate_fn and worker_init_fn reach the child pickled."""
        return self.name != "fork"

    @property
    def uses_server(self) -> bool:
        """Children are forked by a fork server, not by this process."""
        return self.name == "forkserver"

    def context(self) -> BaseContext:
        return multiprocessing.get_context(self.name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class SupervisionPolicy:
    """The keyword-only failure options of ``DataLoader``.

    * ``max_worker_restarts``: dead workers replaced (and their tasks re-sent)
      over the iterator's life before giving up with ``WorkerCrashedError``
      (deaths a sample is proven to cause are not counted).
    * ``on_error``: ``"raise"`` (torch's behaviour) or ``"skip"`` a sample whose
      fetch raises, a batch whose collate raises, and a sample proven to kill its
      worker (it kills a fresh worker alone too). Skipped samples are recorded,
      never silently lost.
    * ``max_errors``: with ``"skip"``, how many samples an epoch may lose — a
      count (int) or a fraction of the epoch (float < 1) — before raising anyway.
    * ``stall_warning``: seconds after which a task still running is reported
      with the worker's Python stack (None: never). The threshold grows to ten
      times the workers' typical time per batch, so slow-but-steady datasets
      are not flagged.
    * ``on_timeout``: when ``timeout`` expires, ``"raise"`` (torch) or
      ``"restart"``: replace the stuck worker (a process is killed, a thread abandoned)
      and retry its tasks.
    """

    max_worker_restarts: int = 3
    on_error: str = "raise"
    max_errors: int | float = 0.01
    stall_warning: float | None = 60.0
    on_timeout: str = "raise"

    def __post_init__(self) -> None:
        restarts = self.max_worker_restarts
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ConfigError(
                f"max_worker_restarts must be an int >= 0, got {self.max_worker_restarts!r}"
            )
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.on_timeout not in ON_TIMEOUT:
            raise ConfigError(f"on_timeout must be one of {ON_TIMEOUT}, got {self.on_timeout!r}")
        budget = self.max_errors
        if not _is_number(budget) or not budget >= 0:  # "not >=" also rejects NaN
            raise ConfigError(
                "max_errors must be a count (int >= 0) or a fraction of the epoch "
                f"(0 <= float < 1), got {budget!r}"
            )
        if isinstance(budget, float) and budget >= 1:
            raise ConfigError(
                f"max_errors as a float is a fraction of the epoch and must be < 1, got {budget!r}"
                f" (for a count, pass an int: max_errors={int(budget)})"
            )
        stall = self.stall_warning
        if stall is not None and not (_is_number(stall) and stall > 0 and math.isfinite(stall)):
            raise ConfigError(
                f"stall_warning must be > 0 seconds or None, got {self.stall_warning!r}"
            )

    @property
    def skipping(self) -> bool:
        return self.on_error == "skip"

    def error_budget(self, epoch_samples: int | None) -> int | None:
        """Samples an epoch may skip; None when a fraction has no epoch size to apply to."""
        if isinstance(self.max_errors, int):
            return self.max_errors
        if epoch_samples is None:
            return None
        return math.ceil(self.max_errors * epoch_samples)


@dataclass(frozen=True)
class Options:
    """conveyor's own keyword-only options of ``DataLoader``, validated here (a bad value
    raises a ``ConfigError`` naming it). Each is also a public attribute of the loader,
    under its parameter's name, as torch's arguments are: frameworks that rebuild a
    loader from its attributes (Lightning adding a DistributedSampler) keep them."""

    max_worker_restarts: int = 3
    on_error: str = "raise"
    max_errors: int | float = 0.01
    stall_warning: float | None = 60.0
    on_timeout: str = "raise"
    preflight: bool = True
    snapshot_every_n_steps: int | None = 1  # None: 0, no periodic snapshot
    reseed: str = "worker"
    run_ahead: bool = True
    worker_method: str = "multiprocessing"
    progress: bool = False
    report: bool = False
    worker_options: Mapping[str, Any] | None = None  # Ray actor options (worker_method="ray")
    threads_per_worker: int = 1  # worker cores per worker process, each in a thread

    def __post_init__(self) -> None:
        self.policy()  # checks the failure options
        for flag in ("preflight", "run_ahead", "progress", "report"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        check_reseed(self.reseed)
        every = 0 if self.snapshot_every_n_steps is None else self.snapshot_every_n_steps
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ConfigError(
                "snapshot_every_n_steps must be an int >= 0 (0: no periodic snapshot), "
                f"got {self.snapshot_every_n_steps!r}"
            )
        object.__setattr__(self, "snapshot_every_n_steps", every)
        if self.worker_method not in WORKER_METHODS:
            raise ConfigError(
                f"worker_method must be one of {WORKER_METHODS}, got {self.worker_method!r}: "
                "'multiprocessing' runs each worker in a process (torch's default), "
                "'thread' in a thread of this process, 'ray' in an actor on a Ray cluster"
            )
        check_worker_options(self.worker_method, self.worker_options)
        check_threads_per_worker(self.threads_per_worker, self.worker_method)

    def policy(self) -> SupervisionPolicy:
        return SupervisionPolicy(
            max_worker_restarts=self.max_worker_restarts,
            on_error=self.on_error,
            max_errors=self.max_errors,
            stall_warning=self.stall_warning,
            on_timeout=self.on_timeout,
        )


@dataclass(frozen=True)
class LoaderConfig:
    """Everything an iterator needs, validated (see ``DataLoader``)."""

    dataset: Any
    collate_fn: Any
    worker_init_fn: Any
    sampler: Any  # yields dataset indices (or placeholders for iterable datasets)
    batch_sampler: Any  # None without automatic batching
    iterable: bool  # an iterable-style dataset
    batch_size: int | None
    drop_last: bool
    generator: Any
    num_workers: int
    prefetch_factor: int  # 0 without workers
    timeout: float
    in_order: bool
    persistent_workers: bool
    pin_memory: bool
    pin_memory_device: str
    start_method: StartMethod
    policy: SupervisionPolicy = field(default_factory=SupervisionPolicy)
    preflight: bool = True
    reseed: str = "worker"  # see conveyor._reseed
    snapshot_every_n_steps: int = 1  # how often workers' dataset states are snapshotted
    run_ahead: bool = True  # small batches: tasks beyond prefetch_factor (see DataLoader)
    worker_method: str = "multiprocessing"  # or "thread", "ray": see DataLoader
    worker_options: Mapping[str, Any] | None = None  # Ray actor options (worker_method="ray")
    progress: bool = False  # a progress line as epochs go (observe/progress.py)
    report: bool = False  # the epoch's figures and verdict at its end (observe/watch.py)
    tuner: Autotuner | None = None  # num_workers="auto": chose the count, adapts it
    # Worker cores per worker process, each in a thread: num_workers above counts cores
    # (the loader's num_workers times this), each a worker to the loop, get_worker_info()
    # and a checkpoint; the pool keeps each process's cores together.
    threads_per_worker: int = 1

    @property
    def fixed_count(self) -> bool:
        """An iterable dataset's shards, or a dataset's own state, follow the worker count:
        ``num_workers="auto"`` chooses it once and keeps it."""
        return self.iterable or self.dataset_keeps_state

    @property
    def info_method(self) -> str:
        """What ``get_worker_info().worker_method`` says: "thread" for every worker that
        shares its process with other workers (thread workers, threads_per_worker > 1)."""
        return "thread" if self.threads_per_worker > 1 else self.worker_method

    @property
    def in_threads(self) -> bool:
        """Workers are threads of this process: nothing is pickled or forked."""
        return self.worker_method == "thread"

    @property
    def remote(self) -> bool:
        """Workers are Ray actors, on this machine or others (see _workers/ray_pool.py)."""
        return self.worker_method == "ray"

    @property
    def dataset_keeps_state(self) -> bool:
        """The dataset has ``state_dict``/``load_state_dict`` of its own (torchdata's
        ``Stateful``): its state is saved per worker."""
        return is_stateful(self.dataset)

    @property
    def auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def index_sampler(self) -> Any:
        """What the iterators draw from: a batch of indices per task, or one index."""
        return self.batch_sampler if self.auto_collation else self.sampler

    def epoch_samples(self) -> int | None:
        """Samples the sampler yields per epoch (None: it has no length)."""
        try:
            return len(self.sampler)
        except TypeError:
            return None


@dataclass
class LoaderHistory:
    """What a loader accumulates across its iterators and epochs."""

    epochs_started: int = 0
    skipped: list[SkippedSample] = field(default_factory=list)
    last_statistics: LoaderStatistics | None = None
    iterable_len: int | None = None  # len(dataset) as reported to len(loader), iterable-style
    warned_duplicates: bool = False  # a DuplicateDataWarning was given (once per loader)
    tracer: Tracer | None = None  # recording spans while DataLoader.trace() is entered

    def next_epoch(self) -> int:
        self.epochs_started += 1
        return self.epochs_started - 1


# Actor options that would break what conveyor promises: it restarts workers itself
# (exactly once, within max_worker_restarts), and a worker runs its tasks one at a time,
# in the order sent (an iterable dataset's batches follow that order).
_RAY_OPTIONS_KEPT = {
    "max_restarts": "conveyor replaces dead workers itself (max_worker_restarts)",
    "max_task_retries": "conveyor re-sends a dead worker's tasks itself, exactly once",
    "max_concurrency": "a worker runs its tasks one at a time, in the order sent",
    "concurrency_groups": "a worker runs its tasks one at a time, in the order sent",
    "lifetime": "a worker lives as long as its loader's iterator",
    "name": "each worker's actor is conveyor's own",
    "namespace": "each worker's actor is conveyor's own",
    "get_if_exists": "each worker's actor is conveyor's own",
}


def check_threads_per_worker(threads: Any, worker_method: str) -> None:
    """``threads_per_worker``: an int >= 1; above 1, for worker processes only."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads_per_worker must be an int >= 1, got {threads!r}")
    if threads > 1 and worker_method != "multiprocessing":
        raise ConfigError(
            f"threads_per_worker={threads} runs threads inside worker processes, but "
            f"worker_method={worker_method!r} starts no worker process. Use "
            "worker_method='multiprocessing' with it, or drop it (with worker_method='thread', "
            "num_workers is the number of threads)."
        )


def check_worker_options(worker_method: str, options: Mapping[str, Any] | None) -> None:
    """``worker_options`` go to Ray as actor options (CPUs per worker, custom resources,
    a runtime environment): a mapping of option names, for ``worker_method="ray"`` only.
    Ray checks the names and values it knows when the workers start."""
    if options is None:
        return
    if worker_method != "ray":
        raise ConfigError(
            f"worker_options={options!r} are Ray actor options: they need "
            f"worker_method='ray', got worker_method={worker_method!r}. Drop worker_options, "
            "or pass worker_method='ray'."
        )
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(
            "worker_options must be a mapping of Ray actor option names to values, e.g. "
            f"{{'num_cpus': 2, 'runtime_env': {{'pip': ['pillow']}}}}, got {options!r}"
        )
    for key, why in _RAY_OPTIONS_KEPT.items():
        if key in options:
            raise ConfigError(
                f"worker_options[{key!r}] cannot be set: {why}. Drop it from worker_options."
            )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
