"""Measuring one loader run: throughput over a timed window, time to first batch, the
time an epoch takes when every epoch starts its workers anew, or a training loop's
time spent waiting for data.

Every run records the main process's CPU time and minor page faults; the CPU time and
minor page faults of its descendants (the loader's workers: children, or the fork server's
children under ``forkserver``; multiprocessing's helpers left out), read from ``/proc`` at
both ends of the window; the peak of the summed RSS of the main process and its
descendants (sampled a few times, so approximate); and how many worker processes were still
alive a while after the loader was dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

try:
    import resource
except ImportError:  # not on Unix
    resource = None  # type: ignore[assignment]

from conveyor_bench.calls import count_calls
from conveyor_bench.charged import ChargedPeak, charged_peak
from conveyor_bench.measurement import Measurement, touch
from conveyor_bench.processes import (
    PeakPss,
    TreePss,
    TreeUsage,
    count_leftovers,
    descendants,
    peak_added,
    pss_added,
    tree_rss,
)
from conveyor_bench.specs import WindowSpec
from conveyor_bench.workloads import MapDataset, hand_collate, spin

LoaderFactory = Callable[[], Iterable[Any]]
Collate = Callable[[Any], Any]

_MEMORY_SAMPLES = 4
SETTLE_LIMIT_S = 30.0  # num_workers="auto": how long to wait for the count to settle


class PlainLoop:
    """The ceiling: index the dataset and collate by hand (or with the workload's own
    ``collate_fn``), in the main process; ``batches`` of them from batch ``first`` on."""

    def __init__(
        self,
        dataset: MapDataset,
        batch_size: int,
        collate: Collate | None = None,
        first: int = 0,
        batches: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate = collate or hand_collate
        self.first = first
        self.batches = len(dataset) // batch_size - first if batches is None else batches

    def __iter__(self) -> Iterator[Any]:
        dataset, size, collate = self.dataset, self.batch_size, self.collate
        for batch in range(self.first, self.first + self.batches):
            yield collate([dataset[i] for i in range(batch * size, (batch + 1) * size)])


@dataclass(frozen=True)
class Accelerator:
    """The device a training loop copies its batches to (the one torch sees)."""

    device: Any  # a torch.device

    @staticmethod
    def find() -> Accelerator | None:
        """This machine's accelerator, or None (no torch, or none available)."""
        try:
            import torch
        except ImportError:
            return None
        if not torch.accelerator.is_available():
            return None
        return Accelerator(torch.accelerator.current_accelerator())

    def copy(self, batch: Any) -> int:
        """Copy the batch's tensors to the device as training does (``non_blocking``,
        then wait until they are there); the bytes copied."""
        import torch

        copied = 0
        for tensor in _tensors(batch):
            tensor.to(self.device, non_blocking=True)
            copied += tensor.nbytes
        torch.accelerator.synchronize()
        return copied


def _tensors(batch: Any) -> Iterator[Any]:
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        for item in batch:
            yield from _tensors(item)
    elif hasattr(batch, "is_pinned"):  # a torch.Tensor
        yield batch


def _minor_faults() -> int | None:
    """The main process's minor page faults so far (None where ``resource`` is missing)."""
    if resource is None:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _delta(before: int | None) -> int | None:
    after = _minor_faults()
    return None if before is None or after is None else after - before


@dataclass
class TrainingStep:
    """The ``train`` kind's step after each batch: the copy to the accelerator if there
    is one, then ``step_s`` asleep, as the host waits for the device's work (the
    loader's threads and processes run meanwhile) — or, with ``spin_iterations``, that
    much pure Python holding the GIL, as a host launching the device's work does (thread
    workers in this process then compete for it). Sums what the loop spent where."""

    step_s: float
    accelerator: Accelerator | None
    spin_iterations: int = 0
    waited_s: float = 0.0
    copy_s: float = 0.0
    copied_bytes: int = 0
    stepping_s: float = 0.0  # timed steps' own time
    steps: int = 0

    def run(self, batch: Any, timed: bool = True) -> None:
        if self.accelerator is not None:
            copying = time.perf_counter()
            copied = self.accelerator.copy(batch)
            if timed:
                self.copy_s += time.perf_counter() - copying
                self.copied_bytes += copied
        stepping = time.perf_counter()
        if self.spin_iterations:
            spin(self.spin_iterations)
        else:
            time.sleep(self.step_s)
        if timed:
            self.stepping_s += time.perf_counter() - stepping
            self.steps += 1


class _MemoryPeaks:
    """The process tree's peak RSS, sampled at each quarter of a window: of its time, or
    of its batches when it has no time limit."""

    def __init__(self, window: WindowSpec) -> None:
        self.window, self.next, self.peak = window, 1, tree_rss()

    def after(self, elapsed: float, batches: int) -> None:
        window = self.window
        if window.seconds > 0:
            at = elapsed * _MEMORY_SAMPLES / window.seconds
        else:
            at = batches * _MEMORY_SAMPLES / window.max_batches
        if at >= self.next:
            self.next += 1
            self.peak = max(self.peak, tree_rss())


def _warm_up(it: Iterator[Any], window: WindowSpec, train: TrainingStep | None) -> None:
    for _ in range(window.warmup):
        warm = next(it)
        touch(warm)
        if train is not None:
            train.run(warm, timed=False)
        del warm


def _time_window(
    make_loader: LoaderFactory,
    window: WindowSpec,
    train: TrainingStep | None = None,
    settle: bool = False,
    charged: ChargedPeak | None = None,
) -> Measurement:
    # The loader and its iterator are locals: they are dropped when this returns.
    before_loader = TreePss.read() if window.measure_memory or window.peak_memory else None
    if charged is not None:
        charged.begin()
    loader = make_loader()
    it = iter(loader)
    _warm_up(it, window, train)
    settled, settled_workers = _settle(loader, it, train) if settle else (None, None)
    # Counted before the window, not at the epoch's end (where no more tasks go out).
    calls = count_calls(lambda: next(it), window.count_calls) if window.count_calls else None
    sampler = PeakPss.start() if window.peak_memory else None
    result = _timed(it, window, train)
    peak_pss = sampler.stop() if sampler is not None else None
    added = pss_added(before_loader) if before_loader and window.measure_memory else None
    return dataclasses.replace(
        result,
        settled_after_s=settled,
        settled_workers=settled_workers,
        waited_to_settle=settle,
        loader_pss_bytes=added[0] if added else None,
        workers_pss_bytes=added[1] if added else None,
        peak_pss_bytes=peak_added(peak_pss, before_loader),
        pss_samples=sampler.samples if sampler is not None else 0,
        charged_peak_bytes=charged.added() if charged is not None else None,
        main_python_calls=calls.python if calls and calls.batches else None,
        main_calls=calls.total if calls and calls.batches else None,
    )


def _timed(it: Iterator[Any], window: WindowSpec, train: TrainingStep | None) -> Measurement:
    """The timed window itself: batches, time, CPU and faults (main and workers), RSS."""
    memory = _MemoryPeaks(window)
    samples = batches = 0
    workers0 = TreeUsage.read()
    faults0, cpu0 = _minor_faults(), time.process_time()
    t0 = now = time.perf_counter()
    while batches < window.max_batches and (
        batches < window.min_batches or now - t0 < window.seconds
    ):
        asked = time.perf_counter()
        batch = next(it)
        if train is not None:
            train.waited_s += time.perf_counter() - asked
        samples += touch(batch)
        if train is not None:
            train.run(batch)
        del batch  # a training step runs on the device's copy: the host batch can go
        batches += 1
        now = time.perf_counter()
        memory.after(now - t0, batches)
    seconds = now - t0
    cpu, faults = time.process_time() - cpu0, _delta(faults0)
    workers = TreeUsage.read()
    workers_cpu, workers_faults = workers.since(workers0)
    result = Measurement(
        batches,
        samples,
        seconds,
        cpu,
        memory.peak,
        0,
        faults,
        workers_cpu_s=workers_cpu,
        workers_page_faults=workers_faults,
        worker_processes=len(workers.usage),
    )
    if train is None:
        return result
    return dataclasses.replace(
        result,
        waited_s=train.waited_s,
        copy_s=train.copy_s,
        copied_bytes=train.copied_bytes,
        step_ms=1000 * train.stepping_s / train.steps if train.steps else None,
    )


def _time_first_batch(make_loader: LoaderFactory) -> Measurement:
    faults0, cpu0, t0 = _minor_faults(), time.process_time(), time.perf_counter()
    it = iter(make_loader())
    samples = touch(next(it))
    seconds = time.perf_counter() - t0
    cpu, faults = time.process_time() - cpu0, _delta(faults0)
    return Measurement(1, samples, seconds, cpu, tree_rss(), 0, faults)


def _time_epochs(make_loader: LoaderFactory, window: WindowSpec) -> Measurement:
    # One loader, iterated epoch after epoch as a training loop does; each epoch is timed
    # from iter() (where non-persistent workers start) to the end of its last batch.
    loader = make_loader()
    for _ in range(window.warmup):
        for batch in loader:
            touch(batch)
    peak: int | None = None
    paused = 0.0  # time spent sampling memory, left out of the window
    epochs = samples = batches = 0
    faults0, cpu0 = _minor_faults(), time.process_time()
    t0 = now = time.perf_counter()
    while epochs < window.max_batches and (
        epochs < window.min_batches or now - t0 - paused < window.seconds
    ):
        for batch in loader:
            samples += touch(batch)
            batches += 1
            if peak is None:  # once, while the first timed epoch's workers are alive
                sampled = time.perf_counter()
                peak = tree_rss()
                paused += time.perf_counter() - sampled
        epochs += 1
        now = time.perf_counter()
    seconds = now - t0 - paused
    cpu, faults = time.process_time() - cpu0, _delta(faults0)
    return Measurement(batches, samples, seconds, cpu, peak, 0, faults, epochs)


def measure_epochs(make_loader: LoaderFactory, window: WindowSpec) -> Measurement:
    """Time whole epochs of one loader (after ``window.warmup`` untimed ones), counting
    epochs where ``window`` says batches; then drop the loader."""
    before = descendants()
    result = _time_epochs(make_loader, window)
    return dataclasses.replace(result, leaked_processes=count_leftovers(before))


def _settle(
    loader: Any, it: Iterator[Any], train: TrainingStep | None
) -> tuple[float | None, int | None]:
    """Batches until conveyor's ``num_workers="auto"`` says its count settled (at most
    :data:`SETTLE_LIMIT_S`): the seconds it took, from its start, and the count; or Nones."""
    deadline, batches = time.perf_counter() + SETTLE_LIMIT_S, 0
    while time.perf_counter() < deadline:
        batch = next(it)
        touch(batch)
        if train is not None:
            train.run(batch, timed=False)
        del batch
        batches += 1
        if batches % 8 == 0:
            stats = loader.statistics()
            if stats.settled_after_s is not None:
                return float(stats.settled_after_s), stats.auto_workers
    return None, None


def measure_throughput(
    make_loader: LoaderFactory, window: WindowSpec, *, settle: bool = False
) -> Measurement:
    """Time a window of batches after warm-up (with ``settle``, after conveyor's
    ``num_workers="auto"`` settled too); the loader is built and dropped in here (with
    ``window.measure_memory``, in a memory cgroup of its own where one can be made: the
    kernel keeps its peak, at no cost to the window, see charged.py)."""
    return _measured(make_loader, window, None, settle, window.measure_memory)


def measure_training(
    make_loader: LoaderFactory,
    window: WindowSpec,
    step_s: float,
    accelerator: Accelerator | None = None,
    *,
    settle: bool = False,
    spin_iterations: int = 0,
) -> Measurement:
    """Time a training loop over a window of batches (see :class:`TrainingStep`); the
    loader is built and dropped in here (with ``window.peak_memory``, in a memory cgroup
    of its own where one can be made: see charged.py)."""
    step = TrainingStep(step_s, accelerator, spin_iterations)
    return _measured(make_loader, window, step, settle, window.peak_memory)


def _measured(
    make_loader: LoaderFactory,
    window: WindowSpec,
    train: TrainingStep | None,
    settle: bool,
    in_cgroup: bool,
) -> Measurement:
    before = descendants()
    with charged_peak() if in_cgroup else contextlib.nullcontext() as charged:
        result = _time_window(make_loader, window, train, settle, charged)
        leftovers = count_leftovers(before)  # (gone before the group is removed)
    return dataclasses.replace(result, leaked_processes=leftovers)


def measure_startup(make_loader: LoaderFactory) -> Measurement:
    """Time from building the loader to holding its first batch; then drop the loader."""
    before = descendants()
    result = _time_first_batch(make_loader)
    return dataclasses.replace(result, leaked_processes=count_leftovers(before))


def cpu_count_line() -> str:
    """Cores: logical count and how many this process may run on."""
    logical = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = logical
    physical = psutil.cpu_count(logical=False)
    return f"{logical} logical ({physical} physical), {usable} usable by this process"
