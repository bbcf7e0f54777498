"""``DataLoader``: torch 2.13's arguments, checked and turned into an iterator.

Every argument keeps torch's name, default, meaning, and the exception type
torch raises for a bad combination. The work happens in ``_iter``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from multiprocessing.context import BaseContext
from typing import Any

from . import _torch
from ._iter.duplicates import unsharded_ranks
from ._iter.inline import InlineIterator
from ._iter.multiprocess import MultiprocessIterator
from ._iter.parse_state import parse
from ._iter.progress import Progress
from ._iter.state import ResumePoint
from ._task.dataset_calls import replay_in_main, watch
from ._torch.rules import start_context, too_many_workers
from .config import LoaderConfig, LoaderHistory, Options
from .diagnostics.preflight import run_automatic, warn_at_construction
from .errors import DuplicateDataWarning, PrefetchFactorError
from .integrations.replaced import AcceleratePrepared
from .observe.trace import Tracer, recording
from .observe.verdict import Verdict, diagnose
from .records import LoaderStatistics, SkippedSample

__all__ = ["DataLoader"]

_FROZEN_AFTER_INIT = frozenset(
    {"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"}
)
# torch's public attributes that are the config's fields of the same name.
_TORCH_ATTRIBUTES = (
    "dataset", "batch_size", "drop_last", "sampler", "batch_sampler", "generator",
    "collate_fn", "prefetch_factor", "pin_memory", "pin_memory_device", "timeout",
    "worker_init_fn", "in_order", "persistent_workers",
)  # fmt: skip


_torch_module = _torch.load()
# With torch installed, conveyor's loader *is* a torch DataLoader to every isinstance
# check (Lightning, accelerate and others treat other iterables as opaque and, under
# DDP, would not shard them). Nothing of torch's implementation runs: every method
# and property torch's class has is defined here.
_BASES: tuple[type, ...] = (
    (_torch_module.utils.data.DataLoader,) if _torch_module is not None else ()
)


class DataLoader(*_BASES):  # type: ignore[misc]
    """Iterate over ``dataset`` in batches, optionally with worker processes.

    A drop-in replacement for ``torch.utils.data.DataLoader``: same arguments, defaults
    and semantics (torch 2.13's, up to ``in_order``), and the exception types torch
    raises for a bad combination. Batches hold torch tensors when torch is installed
    (exactly as torch's ``default_collate`` builds them), NumPy arrays otherwise. With
    torch installed the loader *is* a ``torch.utils.data.DataLoader`` to every
    ``isinstance`` check (Lightning, accelerate).

    conveyor's own options come after torch's, keyword-only, and are described in
    :class:`~conveyor.config.Options`: what to do when workers die, hang or meet a bad
    sample (``max_worker_restarts``, ``on_error``, ``max_errors``, ``stall_warning``,
    ``on_timeout``), the pre-flight checks (``preflight``), random draws independent
    of the worker count (``reseed``), the dataset's calls between epochs that reach
    every worker's copy (``epoch_calls``), the kind of worker (``worker_method``,
    ``worker_options``, ``threads_per_worker``), ``run_ahead``, and what the loader
    shows as it runs (``progress``, ``report``). Their defaults change nothing a
    torch user relies on, except that a dead worker is replaced instead of ending the
    run. ``conveyor.check(loader)`` prints the full pre-flight report.
    """

    _initialized = False
    #: conveyor's own keyword-only options, each kept as a public attribute of that name.
    conveyor_options = tuple(f.name for f in dataclasses.fields(Options))
    # ``DataLoader[Batch]`` in annotations, as torch's loader is Generic.
    __class_getitem__: Any = classmethod(types.GenericAlias)
    # Read by accelerate's prepare(), which would replace this loader with torch's:
    # it warns, naming the fix (see conveyor.integrations.replaced).
    _is_accelerate_prepared = AcceleratePrepared()

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Iterable[Any] | None = None,
        batch_sampler: Iterable[list[Any]] | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], Any] | None = None,
        multiprocessing_context: str | BaseContext | None = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        max_worker_restarts: int = 3,
        on_error: str = "raise",
        max_errors: int | float = 0.01,
        stall_warning: float | None = 60.0,
        on_timeout: str = "raise",
        preflight: bool = True,
        snapshot_every_n_steps: int | None = 1,
        reseed: str = "worker",
        run_ahead: bool = True,
        worker_method: str = "multiprocessing",
        progress: bool = False,
        report: bool = False,
        worker_options: Mapping[str, Any] | None = None,
        threads_per_worker: int = 1,
        epoch_calls: Sequence[str] = ("set_epoch",),
    ) -> None:
        arguments = locals()  # conveyor's own options go on by name: Options' fields
        config = LoaderConfig.from_torch_args(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
            **{name: arguments[name] for name in self.conveyor_options},
        )  # fmt: skip
        self._adopt(config)
        self._dataset_kind = 1 if config.iterable else 0  # torch's _DatasetKind: Map, Iterable
        watch(config.dataset, config.options.epoch_calls)  # the instance's, never its class's
        self._pending_state: ResumePoint | None = None  # load_state_dict: for the next iter()
        self._progress: Progress | None = None  # what the current (or last) iterator handed out
        self._primed: InlineIterator | MultiprocessIterator | None = None  # made by state_dict()
        self._preflight_pending = config.options.preflight  # on the first iter() with workers
        self._last_iterator: weakref.ref[Any] | None = None
        self._history = LoaderHistory()  # epochs, skipped samples, last statistics
        self._iterator: Any = None  # persistent workers' (or a subclass's own) iterator
        self._config = config
        self._initialized = True
        self.check_worker_number_rationality()
        warn_at_construction(config)  # what thread workers cannot keep: said now

    def _adopt(self, config: LoaderConfig) -> None:
        """torch's public attributes, and conveyor's options, as ``config`` has them."""
        for name in _TORCH_ATTRIBUTES:
            setattr(self, name, getattr(config, name))
        self.num_workers = config.processes
        self._multiprocessing_context = config.multiprocessing_context
        for name in self.conveyor_options:
            setattr(self, name, getattr(config.options, name))

    # --- torch's attribute rules -------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if self._initialized and name in _FROZEN_AFTER_INIT:
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is initialized"
            )
        kept = self.__dict__.get("_iterator")
        if name == "_iterator" and value is None and isinstance(kept, MultiprocessIterator):
            kept.close()  # Lightning's reset: torch's persistent workers are shut down there
        super().__setattr__(name, value)
        if self._initialized and not name.startswith("_"):
            # torch lets some arguments change after __init__ (num_workers,
            # collate_fn, timeout...): the config follows them.
            config = self._config.following(name, getattr(self, name))
            super().__setattr__("_config", config)
            if name == "epoch_calls":
                watch(config.dataset, config.options.epoch_calls)

    @property
    def multiprocessing_context(self) -> BaseContext | None:
        """The start method's context for worker processes (torch's attribute; set it
        with a name such as ``"spawn"`` or a context)."""
        return self._multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, value: str | BaseContext | None) -> None:
        self._multiprocessing_context = start_context(value, self.num_workers)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (or deep-copied) as torch's loader is, also once iterated: the arguments,
        conveyor's options, the history and a state loaded for the next ``iter()``; not the
        iterator, whose workers a copy cannot share (the copy's ``iter()`` starts afresh)."""
        state = dict(self.__dict__)
        state.update(_iterator=None, _primed=None, _last_iterator=None, _progress=None)
        state["_history"] = dataclasses.replace(self._history, tracer=None)
        return state

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    # --- iteration --------------------------------------------------------

    def __iter__(self) -> Any:
        primed, self._primed = self._primed, None
        if primed is not None and not getattr(primed, "closed", False):
            return primed  # made by state_dict() before the first iter(), as torchdata does
        return self._next_iterator()

    def _next_iterator(self) -> Any:
        """torch's ``__iter__``: persistent workers keep one iterator, reset each epoch
        (a state loaded meanwhile starts them afresh); else ``_get_iterator()``, which a
        subclass may override, as with torch's loader."""
        if not (self.persistent_workers and self.num_workers > 0):
            return self._get_iterator()
        kept = self._iterator
        if kept is None or getattr(kept, "closed", False) or self._pending_state is not None:
            _stop(kept)
            self._iterator = self._get_iterator()
        elif isinstance(kept, MultiprocessIterator):
            kept.reset()
            self._watch(kept)
        else:
            kept._reset(self)  # a subclass's own iterator: torch's call
        return self._iterator

    def _get_iterator(self) -> InlineIterator | MultiprocessIterator:
        """A new iterator over the loader (torch's hook, called by ``iter()``)."""
        iterator: InlineIterator | MultiprocessIterator
        config = self._config
        # Ray workers get the objects pickled when their pool starts, which names what does
        # not pickle (as spawn's pre-flight would); thread workers get checked for what
        # threads must not share (diagnostics/thread_hazards.py).
        checked = config.kind.automatic_preflight
        if self.num_workers > 0 and self._preflight_pending and checked:
            # Raises an ERROR before any worker starts, warns once, at the user's iter()
            # (or state_dict()) line: five frames up.
            run_automatic(config, stacklevel=5)
            self._preflight_pending = False
        resume, self._pending_state = self._pending_state, None
        if not self._history.warned_duplicates:
            text = unsharded_ranks(config)
            if text is not None:
                self._history.warned_duplicates = True
                # At the user's iter() (or state_dict()) line: four frames up.
                warnings.warn(text, DuplicateDataWarning, stacklevel=4)
        if self.num_workers == 0:
            iterator = InlineIterator(config, self._history, resume)
        elif self.prefetch_factor == 0:
            raise PrefetchFactorError(
                "prefetch_factor=0 with num_workers > 0 would never ask a worker for a batch; "
                "use prefetch_factor >= 1 (2 is the default)"
            )
        else:
            self.check_worker_number_rationality()
            iterator = MultiprocessIterator(config, self._history, resume=resume)
        self._watch(iterator)
        return iterator

    def _watch(self, iterator: InlineIterator | MultiprocessIterator) -> None:
        # A weak reference: holding the iterator would keep its workers alive
        # after the user's loop is gone.
        self._last_iterator = weakref.ref(iterator)
        self._progress = iterator.progress

    # --- checkpoint and resume ------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is, as plain data (torchdata ``StatefulDataLoader``'s layout).

        Taken at any time: before ``iter()``, mid-epoch, after the epoch. It depends
        only on the batches handed out (not on what workers prefetched), and does
        not change as iteration goes on. ``load_state_dict`` on a new loader resumes
        at the next batch, with the same batches in the same order.
        """
        if self._progress is None or self._pending_state is not None:
            # Nothing to describe yet (or a loaded state waits): make the iterator now,
            # as torchdata does; the next iter() returns it.
            self._primed = self._next_iterator()
        assert self._progress is not None
        return self._progress.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s result: the next ``iter()`` continues where it
        was taken. A malformed state raises a ``StateError`` (a ``ValueError``) naming
        the key; resuming per-worker state with another ``num_workers`` raises a
        ``WorkerCountError`` (also an ``AssertionError``) at ``iter()``."""
        if state_dict == {}:
            return  # torchdata: an empty state changes nothing
        self._pending_state = parse(
            state_dict, dataset_len=self._dataset_len(), iterable=self._config.iterable
        )
        # The dataset as the run the state was taken in had it (set_epoch...): every worker
        # started from now on gets those calls; one the user makes afterwards wins.
        config = self._config
        replay_in_main(config.dataset, self._pending_state.calls, config.options.epoch_calls)
        primed, self._primed = self._primed, None
        if primed is not None:
            primed.close()
        _stop(self._iterator)  # persistent workers restart from the loaded state
        self._iterator = None

    def _dataset_len(self) -> int | None:
        if self._config.iterable:
            return None
        try:
            return len(self.dataset)
        except TypeError:
            return None

    # --- what the loader reports ------------------------------------------------

    def statistics(self) -> LoaderStatistics | None:
        """Restarts, retries, skipped samples, in-flight tasks and per-worker
        throughput of the current (or last) iteration; None before the first."""
        iterator = self._last_iterator() if self._last_iterator is not None else None
        if iterator is not None and not iterator.closed:
            statistics: LoaderStatistics = iterator.statistics()
            return statistics
        return self._history.last_statistics

    def diagnose(self) -> Verdict:
        """What holds the training loop back this epoch (or the last one), in words with
        the figures: training itself, the main process, collate, waiting (I/O), fetching,
        or every core in use; and what to change (``str(verdict)``; ``verdict.cause``)."""
        from .diagnostics.environment import cpus

        stats = self.statistics() or LoaderStatistics(0, 0, 0, 0, 0, 0, (), ())
        return diagnose(stats, cpus().usable)

    @contextlib.contextmanager
    def trace(self, path: str | os.PathLike[str]) -> Iterator[Tracer]:
        """``with loader.trace("run.json"): ...``: record every stage of every batch
        loaded meanwhile, per worker and in the main process, and write them at the end
        as Trace Event JSON (open it in ui.perfetto.dev or chrome://tracing, or draw it
        with ``conveyor trace-plot run.json``). A path that cannot be written raises
        here, before the block; the trace is written even if the block raises."""

        def attach(tracer: Tracer | None) -> None:
            self._history.tracer = tracer

        with recording(path, attach) as tracer:
            yield tracer

    @property
    def skipped_samples(self) -> tuple[SkippedSample, ...]:
        """Every sample left out under ``on_error="skip"``, with its epoch and reason."""
        return tuple(self._history.skipped)

    @property
    def _IterableDataset_len_called(self) -> int | None:
        """torch's attribute: ``len(dataset)`` as ``len(loader)`` last reported it for an
        iterable dataset (None before), which code written for torch reads."""
        return self._history.iterable_len

    def __len__(self) -> int:
        if self._config.iterable:
            length = self._history.iterable_len = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    return length // self.batch_size
                return math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self) -> None:
        """Warn, as torch does, when asking for more workers than usable CPUs."""
        if self.num_workers == 0 or not self._config.kind.starts_processes:
            # Threads mostly wait (I/O) or release the GIL: more than cores is fine; Ray's
            # workers use the cluster's CPUs, not this machine's.
            return
        if (text := too_many_workers(self.num_workers)) is not None:
            warnings.warn(text, UserWarning, stacklevel=2)


def _stop(iterator: Any) -> None:
    """Stop a persistent iterator's workers: conveyor's ``close()``, or (a subclass's
    ``_get_iterator`` may return one) torch's own ``_shutdown_workers()``."""
    if iterator is not None:
        (getattr(iterator, "close", None) or iterator._shutdown_workers)()
