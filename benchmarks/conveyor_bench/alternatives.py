"""The other loaders that do the same job, as optional benchmark columns: SPDL's
``get_pytorch_dataloader`` and Grain's ``DataLoader``. Each is built with the loader
arguments the benchmark gives conveyor and torch, configured as its documentation
recommends (benchmarks/README.md says how); neither is a dependency of conveyor.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

from conveyor._torch import DEFER_ENV
from conveyor_bench.workloads import MapDataset

ALTERNATIVES = ("spdl", "grain")
_DISTRIBUTIONS = {"spdl": "spdl", "grain": "grain"}
GRAIN_WORKER_BUFFER = 2  # batches each worker makes ahead: torch's prefetch_factor=2


class NotInstalledError(ImportError):
    """An alternative loader's package is not installed here."""


class SpdlLoader:
    """``spdl.dataloader.get_pytorch_dataloader`` with the benchmark's arguments: its
    defaults otherwise (``prefetch_factor=2``; ``in_order=False``, batches in the order they
    finish). It has no persistent workers: each ``iter()`` starts a process pool."""

    def __init__(
        self,
        dataset: MapDataset,
        *,
        batch_size: int,
        num_workers: int,
        multiprocessing_context: str | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        module = _import("spdl", "spdl.dataloader")
        self._loader = module.get_pytorch_dataloader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=collate_fn,
            multiprocessing_context=multiprocessing_context,
        )

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._loader
        finally:
            # The dataset's pickle lives in a shared-memory segment that SPDL leaves to
            # the resource tracker; give it back when the run ends (workers have it mapped).
            with contextlib.suppress(FileNotFoundError, AttributeError):
                self._loader._shmem.unlink()


class GrainLoader:
    """``grain.python.DataLoader`` over the dataset as a random-access source, in order
    (``IndexSampler``, no shuffle, one epoch), batched by ``grain.python.Batch`` (with the
    workload's ``collate_fn`` as its ``batch_fn``). ``worker_count`` workers, each making
    ``GRAIN_WORKER_BUFFER`` batches ahead; ``ReadOptions(num_threads=0)``, as Grain
    recommends for data already in memory. Grain starts its workers with ``spawn``, always,
    and each worker batches its own share of the records (records ``w, w + n, ...``)."""

    def __init__(
        self,
        dataset: MapDataset,
        *,
        batch_size: int,
        num_workers: int,
        multiprocessing_context: str | None = None,  # Grain always spawns
        collate_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        grain = _import("grain", "grain.python")
        sampler = grain.IndexSampler(
            num_records=len(dataset),
            shard_options=grain.NoSharding(),
            shuffle=False,
            num_epochs=1,
            seed=0,
        )
        self._loader = grain.DataLoader(
            data_source=dataset,
            sampler=sampler,
            operations=[grain.Batch(batch_size, drop_remainder=True, batch_fn=collate_fn)],
            worker_count=num_workers,
            worker_buffer_size=GRAIN_WORKER_BUFFER,
            read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=0),
        )

    def __iter__(self) -> Iterator[Any]:
        # The datasets live in conveyor's package, whose import in a spawned process
        # imports torch unless told it is a worker that defers it: Grain's workers need no
        # torch (its batches are NumPy), as they would not with a user's own dataset module.
        previous = os.environ.get(DEFER_ENV)
        os.environ[DEFER_ENV] = "1"
        try:
            iterator = iter(self._loader)
            iterator.start_prefetch()  # spawns the workers now, with the variable set
        finally:
            if previous is None:
                del os.environ[DEFER_ENV]
            else:
                os.environ[DEFER_ENV] = previous
        try:
            yield from iterator
        finally:
            # Grain's iterator sits in reference cycles: collect it now, so that its
            # finalizer stops the workers and frees the batches' shared memory.
            del iterator
            gc.collect()
            _stop_grain_deleter()


def _stop_grain_deleter() -> None:
    """Grain frees each batch's shared memory from a thread pool it starts in the main
    process and never stops: wait for it, then stop it, so that a later run that forks
    workers (conveyor warns when other threads run) starts as it would without Grain."""
    shared = importlib.import_module("grain._src.python.ipc.shared_memory_array")
    arrays = getattr(shared, "SharedMemoryArray", None)
    deleter = getattr(arrays, "_del_thread_pool", None)
    if arrays is None or deleter is None:
        return
    with arrays._lock:
        arrays._del_thread_pool = None
        arrays._outstanding_del_requests = None
    deleter.close()
    deleter.join()


LOADERS: dict[str, type[SpdlLoader] | type[GrainLoader]] = {
    "spdl": SpdlLoader,
    "grain": GrainLoader,
}


def _import(name: str, module: str) -> Any:
    try:
        with _quiet_absl():
            return importlib.import_module(module)
    except ImportError as exc:
        raise NotInstalledError(f"{name} is not installed (pip install {name})") from exc


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """Grain's import logs a warning through absl when JAX is missing; none is needed."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def describe(name: str) -> str:
    """What the column ran, with its version, or why it cannot run."""
    try:
        version = metadata.version(_DISTRIBUTIONS[name])
    except metadata.PackageNotFoundError:
        return "not installed"
    if name == "spdl":
        return f"spdl.dataloader.get_pytorch_dataloader (spdl {version})"
    return f"grain.python.DataLoader (grain {version})"


def installed(name: str) -> bool:
    return describe(name) != "not installed"
