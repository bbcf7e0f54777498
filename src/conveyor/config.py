"""What a loader was asked to do, as frozen values.

``DataLoader.__init__`` hands its arguments to :meth:`LoaderConfig.from_torch_args`,
which applies torch's rules (``_torch/rules.py``) and checks conveyor's own options
(:class:`Options`, nested), once. The iterators, the pre-flight checks and ``doctor``
read that value and never the ``DataLoader`` itself, so none of them imports
``loader.py``; a public attribute the user sets afterwards, as torch allows for some,
changes it through :meth:`LoaderConfig.following`. What a loader accumulates across
epochs lives in :class:`LoaderHistory`, passed explicitly beside the config.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any, cast

from . import _torch
from . import collate as _collate
from ._task.supervision import SupervisionPolicy
from ._torch import datapipes as _datapipes
from ._torch.rules import sampling, start_context, worker_arguments
from ._workers import kinds
from ._workers.kinds import WorkerKind
from ._workers.start_method import StartMethod
from .dataset import is_iterable_dataset
from .errors import ConfigError
from .observe.autotune import Autotuner, auto_workers
from .records import LoaderStatistics, SkippedSample
from .sampling._reseed import check_reseed
from .stateful import is_stateful

if TYPE_CHECKING:
    from .observe.trace import Tracer

__all__ = [
    "LoaderConfig",
    "LoaderHistory",
    "Options",
    "StartMethod",
    "SupervisionPolicy",
]

# The attributes torch lets a user set after __init__ that are the config's own fields.
_FOLLOWED = frozenset(
    {"collate_fn", "worker_init_fn", "generator", "timeout", "in_order", "pin_memory",
     "pin_memory_device", "multiprocessing_context"}
)  # fmt: skip


@dataclass(frozen=True)
class Options:
    """conveyor's own keyword-only options of ``DataLoader``, validated here (a bad value
    raises a ``ConfigError`` naming it). Each is also a public attribute of the loader,
    under its parameter's name, as torch's arguments are: frameworks that rebuild a
    loader from its attributes (Lightning adding a DistributedSampler) keep them."""

    #: Dead workers replaced (their tasks re-sent) over the iterator's life before giving
    #: up with ``WorkerCrashedError``; deaths a sample is proven to cause do not count.
    max_worker_restarts: int = 3
    #: ``"raise"`` (torch's behaviour) or ``"skip"``: leave out a sample whose fetch
    #: raises, a batch whose collate raises, and a sample proven to kill its worker;
    #: each is recorded (``DataLoader.skipped_samples``), never silently lost.
    on_error: str = "raise"
    #: With ``"skip"``, how many samples an epoch may lose before raising anyway: a
    #: count (int) or a fraction of the epoch (float < 1).
    max_errors: int | float = 0.01
    #: Seconds after which a running task is reported with its worker's Python stack
    #: (``WorkerStallWarning``; None: never). The threshold grows to ten times the
    #: workers' typical time per batch, so slow-but-steady datasets are not flagged.
    stall_warning: float | None = 60.0
    #: When torch's ``timeout`` expires: ``"raise"`` (torch) or ``"restart"``, replace the
    #: stuck worker (a process is killed, a thread abandoned) and retry its tasks.
    on_timeout: str = "raise"
    #: On the first iteration with workers, check the dataset, ``collate_fn`` and
    #: ``worker_init_fn`` for what breaks in workers (a handle forked workers would share,
    #: an object spawn cannot pickle, a huge list every worker copies, threads or CUDA
    #: before fork, a low open-file limit): an error before any worker starts, else a
    #: ``PreflightWarning`` once per loader. A few milliseconds; False skips them.
    preflight: bool = True
    #: torchdata's: every how many batches the workers' dataset states are collected for
    #: ``state_dict()`` (0 or None: only at the start of the epoch).
    snapshot_every_n_steps: int | None = 1
    #: ``"worker"`` (torch's: each worker seeded once), ``"batch"`` or ``"sample"``: seed
    #: ``random``, NumPy and torch before each batch or sample, so that augmentations draw
    #: the same whatever the worker count, and on resume.
    reseed: str = "worker"
    #: When batches are small and quick (under 1 ms of work each), workers take tasks
    #: beyond ``prefetch_factor`` while their slots fit 16 MiB per loader, so that on few
    #: cores they rarely sleep; False keeps exactly ``prefetch_factor``, as torch does.
    run_ahead: bool = True
    #: ``"multiprocessing"`` (torch's worker processes), ``"thread"`` (threads of this
    #: process) or ``"ray"`` (a Ray actor per worker, on the cluster ``ray.init()``
    #: connects to).
    worker_method: str = "multiprocessing"
    #: Show samples/s, the loop's data-wait share, restarts and skips as an epoch goes
    #: (tqdm's bar when tqdm is installed, else a line every 10 seconds).
    progress: bool = False
    #: Log the epoch's figures and the verdict (``DataLoader.diagnose()``) at each epoch's
    #: end on the ``conveyor`` logger (``CONVEYOR_REPORT=1`` does the same).
    report: bool = False
    #: With ``worker_method="ray"``, the actors' options: CPUs per worker, custom
    #: resources, a runtime environment.
    worker_options: Mapping[str, Any] | None = None
    #: Worker processes only: each runs this many workers in threads, each a worker of
    #: its own (``num_workers * threads_per_worker`` in all, as ``get_worker_info()`` and
    #: checkpoints count them): many requests open at the memory of a few processes.
    threads_per_worker: int = 1
    #: The dataset's methods whose calls between epochs reach every worker's copy: what
    #: the training loop calls (``dataset.set_epoch(epoch)``) is made again, with the last
    #: call's arguments, on each worker's copy before it fetches the next epoch's first
    #: sample; persistent workers, thread workers and replacements included, and a
    #: checkpoint keeps those calls. ``()``: none.
    epoch_calls: tuple[str, ...] = ("set_epoch",)

    def __post_init__(self) -> None:
        self.policy  # noqa: B018 (made now: it checks the failure options)
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
        kind = self.kind
        kind.refuse_options(self.worker_options)
        threads = self.threads_per_worker
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads_per_worker must be an int >= 1, got {threads!r}")
        kind.refuse_cores(threads)
        object.__setattr__(self, "epoch_calls", _method_names(self.epoch_calls))

    @functools.cached_property
    def policy(self) -> SupervisionPolicy:
        """The failure options, as the supervisor reads them."""
        return SupervisionPolicy(
            max_worker_restarts=self.max_worker_restarts,
            on_error=self.on_error,
            max_errors=self.max_errors,
            stall_warning=self.stall_warning,
            on_timeout=self.on_timeout,
        )

    @property
    def kind(self) -> WorkerKind:
        """The kind of worker ``worker_method`` names (what the rest asks of it)."""
        return kinds.named(self.worker_method)

    @property
    def snapshot_every(self) -> int:
        """``snapshot_every_n_steps`` as a count (0: no periodic snapshot)."""
        return self.snapshot_every_n_steps or 0


def _method_names(names: Any) -> tuple[str, ...]:
    """``epoch_calls`` as a tuple of method names; a ConfigError naming a bad value."""
    if isinstance(names, str) or not isinstance(names, (tuple, list)):
        raise ConfigError(
            f"epoch_calls must be a tuple of the dataset's method names, e.g. "
            f"('set_epoch', 'set_difficulty'), or () for none; got {names!r}"
        )
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"epoch_calls names the method {name!r}, which is no method name")
    return tuple(names)


@dataclass(frozen=True)
class LoaderConfig:
    """Everything an iterator needs, validated (see ``DataLoader`` and
    :meth:`from_torch_args`): torch's arguments as torch's rules leave them, and
    conveyor's own options."""

    dataset: Any
    collate_fn: Any
    worker_init_fn: Any
    sampler: Any  # yields dataset indices (or placeholders for iterable datasets)
    batch_sampler: Any  # None without automatic batching
    iterable: bool  # an iterable-style dataset
    batch_size: int | None
    drop_last: bool
    generator: Any
    # Worker cores: the loader's num_workers times options.threads_per_worker (each a
    # worker to the loop, get_worker_info() and a checkpoint; the pool keeps each
    # process's cores together).
    num_workers: int
    prefetch_factor: int | None  # as torch keeps it: None without workers
    timeout: float
    in_order: bool
    persistent_workers: bool
    pin_memory: bool
    pin_memory_device: str
    multiprocessing_context: BaseContext | None  # None: the platform's default
    options: Options = field(default_factory=Options)
    tuner: Autotuner | None = None  # num_workers="auto": chose the count, adapts it

    @classmethod
    def from_torch_args(
        cls,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | str = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: str | BaseContext | None = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        **options: Any,
    ) -> LoaderConfig:
        """A loader's config from ``DataLoader``'s arguments (``options``: conveyor's
        own, by name), checked in torch's order, with torch's exceptions."""
        method = options.get("worker_method", Options.worker_method)
        threads = options.get("threads_per_worker", Options.threads_per_worker)
        tuner = auto_workers(num_workers, kinds.find(method), threads)
        workers = tuner.history[0][0] if tuner else cast(int, num_workers)
        prefetch = worker_arguments(workers, timeout, prefetch_factor, persistent_workers)
        iterable = is_iterable_dataset(dataset)
        datapipe = _datapipes.is_iter_datapipe(dataset)
        if _datapipes.is_datapipe(dataset):  # it shuffles and shards itself
            dataset = _datapipes.wrap(dataset, shuffle)
        context = start_context(multiprocessing_context, workers)
        if isinstance(options.get("worker_options"), Mapping):  # the loader's own copy
            options["worker_options"] = dict(options["worker_options"])
        own = Options(**options)  # checked now, so that a bad value fails here
        own.kind.refuse_start_method(multiprocessing_context)
        own.kind.require()
        drawn = sampling(
            dataset, iterable=iterable, datapipe=datapipe, batch_size=batch_size,
            shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            drop_last=drop_last, generator=generator,
        )  # fmt: skip
        if collate_fn is None:
            automatic = drawn.batch_sampler is not None
            collate_fn = _collate.default_collate if automatic else _collate.default_convert
        return cls(
            dataset, collate_fn, worker_init_fn, drawn.sampler, drawn.batch_sampler,
            iterable, drawn.batch_size, drawn.drop_last, generator,
            workers * own.threads_per_worker, prefetch, timeout, in_order,
            persistent_workers, pin_memory, pin_memory_device, context, own, tuner,
        )  # fmt: skip

    def following(self, name: str, value: Any) -> LoaderConfig:
        """This config after the user set the loader's public attribute ``name`` to
        ``value`` (torch lets some change after ``__init__``); itself if ``name`` is
        none of its own."""
        options = self.options
        if name in _FOLLOWED:
            return dataclasses.replace(self, **{name: value})
        if name == "num_workers":
            return dataclasses.replace(self, num_workers=value * options.threads_per_worker)
        if name == "prefetch_factor":
            return dataclasses.replace(self, prefetch_factor=value)
        if name in Options.__dataclass_fields__:
            changed = dataclasses.replace(options, **{name: value})
            workers = self.num_workers // options.threads_per_worker
            cores = workers * changed.threads_per_worker
            return dataclasses.replace(self, options=changed, num_workers=cores)
        return self

    @property
    def processes(self) -> int:
        """The loader's ``num_workers``: worker processes (or threads, actors)."""
        return self.num_workers // self.options.threads_per_worker

    @property
    def prefetch(self) -> int:
        """Tasks out per worker before run-ahead (0 without workers)."""
        return self.prefetch_factor or 0

    @property
    def start_method(self) -> StartMethod:
        """How worker processes start: the platform's default is read when asked (at
        ``iter()``, as torch reads it), so a ``set_start_method()`` after the loader was
        built is honoured."""
        return StartMethod.of(self.multiprocessing_context)

    @property
    def policy(self) -> SupervisionPolicy:
        return self.options.policy

    @property
    def kind(self) -> WorkerKind:
        return self.options.kind

    @property
    def tensors_in_main(self) -> bool:
        """Workers leave the batch's tensors to this process (torch is here; _torch.py)."""
        return self.kind.tensors_in_main and _torch.load() is not None

    @property
    def state_per_worker(self) -> bool:
        """Each worker's dataset has a state of its own (an iterable dataset's iterator,
        a ``Stateful`` dataset's): reported by the workers and saved per worker."""
        return self.iterable or self.dataset_keeps_state

    @property
    def fixed_count(self) -> bool:
        """An iterable dataset's shards, or a dataset's own state, follow the worker count:
        ``num_workers="auto"`` chooses it once and keeps it."""
        return self.state_per_worker

    @property
    def info_method(self) -> str:
        """What ``get_worker_info().worker_method`` says: "thread" for every worker that
        shares its process with other workers (thread workers, threads_per_worker > 1)."""
        options = self.options
        return kinds.THREAD.name if options.threads_per_worker > 1 else options.worker_method

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
