"""What a loader was asked to do, as frozen values.

``DataLoader.__init__`` validates torch's arguments and conveyor's own, then
builds one :class:`LoaderConfig`. The iterators, the pre-flight checks and
``doctor`` read that value and never the ``DataLoader`` itself, so none of
them imports ``loader.py``. What a loader accumulates across epochs lives in
:class:`LoaderHistory`, passed explicitly beside the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._reseed import check_reseed
from ._supervision import SupervisionPolicy
from ._workers import kinds
from ._workers.kinds import WorkerKind
from ._workers.start_method import StartMethod
from .errors import ConfigError
from .records import LoaderStatistics, SkippedSample
from .stateful import is_stateful

if TYPE_CHECKING:
    from .observe.autotune import Autotuner
    from .observe.trace import Tracer

__all__ = [
    "LoaderConfig",
    "LoaderHistory",
    "Options",
    "StartMethod",
    "SupervisionPolicy",
]


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
        kind = kinds.named(self.worker_method)
        kind.refuse_options(self.worker_options)
        threads = self.threads_per_worker
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads_per_worker must be an int >= 1, got {threads!r}")
        kind.refuse_cores(threads)

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
    def kind(self) -> WorkerKind:
        """The kind of worker ``worker_method`` names (what the rest asks of it)."""
        return kinds.named(self.worker_method)

    @property
    def info_method(self) -> str:
        """What ``get_worker_info().worker_method`` says: "thread" for every worker that
        shares its process with other workers (thread workers, threads_per_worker > 1)."""
        return kinds.THREAD.name if self.threads_per_worker > 1 else self.worker_method

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
