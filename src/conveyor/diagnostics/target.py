"""What a check looks at: a dataset, or a loader's dataset and settings (conveyor's
``DataLoader``, its ``LoaderConfig``, or torch's own ``DataLoader``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

from .._workers import kinds
from .._workers.kinds import WorkerKind
from .._workers.start_method import StartMethod
from ..config import LoaderConfig
from . import environment

__all__ = ["Target", "from_config", "target_of"]


@dataclass(frozen=True)
class Target:
    """What a check looks at, whether it was given a DataLoader or a bare dataset."""

    roots: tuple[tuple[str, Any], ...]  # ("dataset", ...), ("collate_fn", ...), ...
    start_method: StartMethod
    num_workers: int
    prefetch_factor: int
    batch_size: int | None  # None: samples are not batched (or a batch_sampler decides)
    auto_collation: bool
    collate_fn: Callable[[Any], Any] | None
    iterable: bool
    kind: WorkerKind = kinds.MULTIPROCESSING
    threads_per_worker: int = 1  # worker processes of several cores in threads
    persistent_workers: bool = False
    # The dataset's methods whose calls the loader makes on its workers' copies between
    # epochs (conveyor's epoch_calls); None: torch's DataLoader, which makes none.
    epoch_calls: tuple[str, ...] | None = ("set_epoch",)

    @property
    def processes(self) -> int:
        """Worker processes (``num_workers`` counts cores: several a process in threads)."""
        return self.num_workers // self.threads_per_worker

    @property
    def threads(self) -> bool:
        """The workers are threads of this process: nothing pickled, nothing forked."""
        return self.kind.in_this_process

    @property
    def dataset(self) -> Any:
        return self.roots[0][1]

    def subject(self) -> str:
        workers = f"{self.processes} worker" + ("" if self.processes == 1 else "s")
        if self.threads_per_worker > 1:
            workers += f" of {self.threads_per_worker} threads"
        kind = type(self.dataset)
        name = f"{kind.__module__}.{kind.__qualname__}"
        if self.threads:
            return f"{name} ({self.num_workers} thread {workers.split(' ', 1)[1]})"
        return f"{name} ({workers}, start method {self.start_method.name!r})"


def target_of(obj: Any, num_workers: int | None, context: str | BaseContext | None) -> Target:
    from ..collate import default_collate
    from ..dataset import is_iterable_dataset

    config = obj if isinstance(obj, LoaderConfig) else _config_of(obj)
    if config is not None:  # a DataLoader (never imported here) or its config
        return from_config(config, num_workers, context)
    if _is_torch_loader(obj):
        return _from_torch_loader(obj, num_workers, context)
    return Target(
        roots=(("dataset", obj),),
        start_method=StartMethod.of(context),
        num_workers=environment.cpus().usable if num_workers is None else num_workers,
        prefetch_factor=2,
        batch_size=1,
        auto_collation=True,
        collate_fn=default_collate,
        iterable=is_iterable_dataset(obj),
    )


def _config_of(obj: Any) -> LoaderConfig | None:
    """A DataLoader's config (a dataset's ``__getattr__`` may raise anything)."""
    try:
        config = getattr(obj, "_config", None)
    except Exception:
        return None
    return config if isinstance(config, LoaderConfig) else None


def _is_torch_loader(obj: Any) -> bool:
    """torch's DataLoader (imported already, if the object is one)."""
    torch_loader = getattr(sys.modules.get("torch.utils.data"), "DataLoader", None)
    return isinstance(torch_loader, type) and isinstance(obj, torch_loader)


def from_config(
    config: LoaderConfig, num_workers: int | None, context: str | BaseContext | None
) -> Target:
    """What to check for a loader: its settings, where ``check()``'s arguments do not
    override them (``num_workers=None`` keeps the loader's, or all usable CPUs for 0)."""
    # The loader's num_workers counts cores; the argument, as DataLoader's, processes.
    workers = (
        config.num_workers
        if num_workers is None
        else num_workers * config.options.threads_per_worker
    )
    return Target(
        roots=(
            ("dataset", config.dataset),
            ("collate_fn", config.collate_fn),
            ("worker_init_fn", config.worker_init_fn),
        ),
        start_method=config.start_method if context is None else StartMethod.of(context),
        num_workers=workers or (environment.cpus().usable if num_workers is None else 0),
        prefetch_factor=config.prefetch_factor or 2,
        batch_size=config.batch_size,
        auto_collation=config.auto_collation,
        collate_fn=config.collate_fn,
        iterable=config.iterable,
        kind=config.kind,
        threads_per_worker=config.options.threads_per_worker,
        persistent_workers=config.persistent_workers,
        epoch_calls=config.options.epoch_calls,
    )


def _from_torch_loader(loader: Any, num_workers: int | None, context: Any) -> Target:
    """What to check for torch's own DataLoader: its dataset and settings (it makes no
    call on its workers' copies between epochs)."""
    from ..dataset import is_iterable_dataset

    workers = loader.num_workers if num_workers is None else num_workers
    return Target(
        roots=(
            ("dataset", loader.dataset),
            ("collate_fn", loader.collate_fn),
            ("worker_init_fn", loader.worker_init_fn),
        ),
        start_method=StartMethod.of(loader.multiprocessing_context if context is None else context),
        num_workers=workers or (environment.cpus().usable if num_workers is None else 0),
        prefetch_factor=loader.prefetch_factor or 2,
        batch_size=loader.batch_size,
        auto_collation=loader.batch_sampler is not None,
        collate_fn=loader.collate_fn,
        iterable=is_iterable_dataset(loader.dataset),
        persistent_workers=bool(loader.persistent_workers),
        epoch_calls=None,
    )
