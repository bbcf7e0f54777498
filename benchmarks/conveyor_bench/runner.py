"""Run the workloads with conveyor and torch side by side and collect the results.

Each table row is one loader configuration; each repeat (a round) runs every loader once,
alternating which goes first, so slow drift on a noisy machine hits both alike. A figure is
the median over the rounds, shown with its spread. A failing loader is recorded on its row
and the benchmark goes on.
"""

from __future__ import annotations

import functools
import gc
import importlib
import multiprocessing
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TextIO

from conveyor_bench import alternatives
from conveyor_bench.machine import MachineCheck, machine_check
from conveyor_bench.measure import (
    Accelerator,
    LoaderFactory,
    Measurement,
    PlainLoop,
    cpu_count_line,
    measure_epochs,
    measure_startup,
    measure_throughput,
    measure_training,
)
from conveyor_bench.notes import annotate
from conveyor_bench.reference import SharedMemoryLoop
from conveyor_bench.rows import (
    ALTERNATIVES,
    INLINE_CONFIG,
    LOADERS,
    NOT_INSTALLED,
    PLAIN,
    REFERENCE,
    TIMED_KINDS,
    Row,
    RowKind,
)
from conveyor_bench.specs import DEFAULT_WORKLOADS, WORKLOADS, WorkloadSpec
from conveyor_bench.workloads import MapDataset, Repeated, calibrate_spin

__all__ = [
    "ALTERNATIVES",
    "INLINE_CONFIG",
    "LOADERS",
    "PLAIN",
    "REFERENCE",
    "TIMED_KINDS",
    "BenchOptions",
    "BenchReport",
    "Row",
    "RowKind",
    "run_benchmark",
]

ALL_LOADERS = (*LOADERS, *ALTERNATIVES)
QUICK_LOADERS = LOADERS  # --quick leaves the alternatives out unless --loaders names them
_TORCH_WORKER_WARNING = r"This DataLoader will create \d+ worker processes in total"
SETTLE_REPEATS = 1000  # a window's dataset over again, for the seconds 'auto' takes to settle
_MACHINE_CHECK_S = (0.3, 0.05)  # each process's run in the machine check: full, --quick

# conveyor's per-batch features, all on: what they cost is the gap to the workers row.
FEATURES: dict[str, Any] = {"reseed": "batch", "snapshot_every_n_steps": 1, "on_error": "skip"}
LoaderClass = Callable[..., Iterable[Any]]
Factories = dict[str, LoaderFactory]


@dataclass(frozen=True)
class BenchOptions:
    """What to run; validated on creation."""

    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    quick: bool = False
    repeat: int = 3
    start_method: str | None = None
    stand_in_torch: bool = False
    seconds: float = 3.0
    loaders: tuple[str, ...] | None = None  # None: all, or with quick conveyor and torch

    def __post_init__(self) -> None:
        unknown_loaders = [name for name in self.loaders or () if name not in ALL_LOADERS]
        if unknown_loaders or self.loaders == ():
            raise ValueError(
                f"loaders={list(self.loaders or ())!r}: choose from {', '.join(ALL_LOADERS)}"
            )
        if not self.seconds > 0:
            raise ValueError(f"seconds={self.seconds!r}: must be positive")
        unknown = [name for name in self.workloads if name not in WORKLOADS]
        if unknown or not self.workloads:
            raise ValueError(
                f"workloads={list(self.workloads)!r}: choose from {', '.join(WORKLOADS)}"
            )
        if self.repeat < 1:
            raise ValueError(f"repeat={self.repeat!r}: must be at least 1")
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(
                f"start_method={self.start_method!r}: this platform has {', '.join(methods)}"
            )

    @property
    def chosen_loaders(self) -> tuple[str, ...]:
        """The loaders to run, in the columns' order."""
        wanted = self.loaders or (QUICK_LOADERS if self.quick else ALL_LOADERS)
        return tuple(name for name in ALL_LOADERS if name in wanted)


@dataclass
class BenchReport:
    environment: dict[str, str]
    options: BenchOptions
    rows: list[Row]


@dataclass(frozen=True)
class _Loaders:
    classes: dict[str, LoaderClass]
    descriptions: dict[str, str]


def _resolve_loaders(options: BenchOptions) -> _Loaders:
    classes: dict[str, LoaderClass] = {}
    described: dict[str, str] = {}
    for name in ALTERNATIVES:
        if name in options.chosen_loaders:
            described[name] = alternatives.describe(name)
            if described[name] != NOT_INSTALLED:
                classes[name] = alternatives.LOADERS[name]
    stand_in_torch = options.stand_in_torch
    try:
        torch_loader = importlib.import_module("torch.utils.data").DataLoader
    except ImportError as exc:
        described["torch"] = f"not available ({type(exc).__name__}: {exc})"
    else:
        classes["torch"] = torch_loader
        described["torch"] = "torch.utils.data.DataLoader"
    if stand_in_torch:
        if "torch" in classes:
            classes["conveyor"] = classes["torch"]
        described["conveyor"] = "torch.utils.data.DataLoader (STAND-IN: --stand-in-torch)"
        return _Loaders(classes, described)
    try:
        classes["conveyor"] = importlib.import_module("conveyor").DataLoader
    except (ImportError, AttributeError) as exc:
        described["conveyor"] = f"not importable ({type(exc).__name__}: {exc})"
    else:
        described["conveyor"] = "conveyor.DataLoader"
    return _Loaders(classes, described)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_environment(loaders: _Loaders, torch_threads: str) -> dict[str, str]:
    default_method = multiprocessing.get_context().get_start_method()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.platform()} ({platform.machine()})",
        "cores": cpu_count_line(),
        "python": sys.version.split()[0],
        "conveyor": _version("conveyor"),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "psutil": _version("psutil"),
        "torchvision": _version("torchvision"),
        "conveyor column": loaders.descriptions.get("conveyor", "-"),
        "torch column": loaders.descriptions.get("torch", "-"),
        **{
            f"{name} column": loaders.descriptions[name]
            for name in ALTERNATIVES
            if name in loaders.descriptions
        },
        "default start method": default_method,
        "torch threads in main process": torch_threads,
    }


def _loader_factory(
    cls: LoaderClass,
    dataset: MapDataset,
    spec: WorkloadSpec,
    workers: int | str,
    method: str | None,
    extra: dict[str, Any] | None = None,
) -> LoaderFactory:
    kwargs: dict[str, Any] = {"batch_size": spec.batch_size, **(extra or {})}
    if spec.collate_fn is not None:
        kwargs["collate_fn"] = spec.collate_fn
    if cls in alternatives.LOADERS.values():  # their own arguments: see alternatives.py
        kwargs.update(num_workers=workers, multiprocessing_context=method)
        return lambda: cls(dataset, **kwargs)
    kwargs["shuffle"] = False
    if workers:
        kwargs.update(num_workers=workers, persistent_workers=spec.persistent_workers)
        if kwargs.get("worker_method") != "thread":  # threads start no process
            kwargs["multiprocessing_context"] = method
    return lambda: cls(dataset, **kwargs)


def _config_label(spec: WorkloadSpec, method: str | None) -> str:
    parts = [f"{spec.num_workers} workers"]
    if spec.persistent_workers:
        parts.append("persistent")
    if method:
        parts.append(method)
    return ", ".join(parts)


def _row_methods(spec: WorkloadSpec, options: BenchOptions) -> list[str | None]:
    """The start method of each of the workload's rows (None: the loader's default)."""
    wanted = (options.quick and spec.quick_start_methods) or spec.start_methods
    if not wanted:
        return [options.start_method]
    available = multiprocessing.get_all_start_methods()
    return [method for method in wanted if method in available]


class _Progress:
    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def __call__(self, text: str) -> None:
        if self.stream is not None:
            print(text, file=self.stream, flush=True)


def _run_row(
    row: Row,
    factories: Factories,
    measure: Callable[[LoaderFactory], Measurement],
    repeat: int,
    progress: _Progress,
) -> None:
    names = list(factories)
    for attempt in range(repeat):
        shift = attempt % len(names)
        for name in names[shift:] + names[:shift]:
            if name in row.errors:
                continue
            try:
                result = measure(factories[name])
            except Exception as exc:  # a loader's failure goes on its row, not up the stack
                row.errors[name] = _failure(exc)
                progress(f"  {row.workload} | {row.config} | {name}: FAILED {row.errors[name]}")
                continue
            row.runs.setdefault(name, []).append(result)
            if row.kind == "startup":
                value = f"{result.seconds:.2f} s to first batch"
            elif row.kind == "epochs":
                value = f"{1000 * (result.seconds_per_epoch or 0):,.0f} ms an epoch"
            elif row.kind == "train":
                value = f"{result.samples_per_s:,.0f} samples/s, {result.waited_share:.0%} waiting"
            else:
                value = f"{result.samples_per_s:,.0f} samples/s"
            progress(f"  {row.workload} | {row.config} | {name} #{attempt + 1}: {value}")


def _run_workload(
    spec: WorkloadSpec, options: BenchOptions, loaders: _Loaders, progress: _Progress
) -> list[Row]:
    if spec.kind == "ray":
        return _run_remote(spec, options, loaders, progress)
    methods = _row_methods(spec, options)
    method = methods[0] if methods else None
    window = spec.window(options.quick, options.seconds)
    # (and room for the batches whose calls are counted before the window)
    batches = window.warmup + window.max_batches + window.count_calls
    length = spec.fixed_length or batches * spec.batch_size
    try:
        dataset = spec.make_dataset(length, options.quick)
    except Exception as exc:  # e.g. decode without Pillow: this workload's row says why
        row = Row(spec.name, _config_label(spec, method), "throughput")
        if getattr(exc, "skips_workload", False):  # torchvision's rows without torchvision
            row.notes.append(f"skipped: {exc}")
        else:
            row.errors = {name: _failure(exc) for name in LOADERS if name in loaders.classes}
        progress(f"[{spec.name}] {row.notes[0] if row.notes else 'FAILED: ' + _failure(exc)}")
        annotate(spec, [row])
        return [row]
    progress(f"[{spec.name}] dataset of {len(dataset):,} samples")
    gc.collect()  # what came before is gone; each run collects its own loader after it
    rows: list[Row] = []
    chosen = options.chosen_loaders

    def loader_row(
        config: str,
        kind: RowKind,
        workers: int,
        method: str | None = method,
        extra: dict[str, Any] | None = None,
        names: tuple[str, ...] = LOADERS,
    ) -> tuple[Row, dict[str, LoaderFactory]]:
        row = Row(spec.name, config, kind)
        factories = {}
        for name in names:
            if name not in chosen:
                continue
            if name not in loaders.classes:
                if name in ALTERNATIVES:
                    row.missing[name] = loaders.descriptions.get(name, NOT_INSTALLED)
                continue
            cls = loaders.classes[name]
            factories[name] = _loader_factory(cls, dataset, spec, workers, method, extra)
        return row, factories

    def run(row: Row, factories: Factories, measure: Callable[..., Measurement]) -> None:
        """Run the row's loaders; keep the row if any ran or one is missing here."""
        if factories or row.missing:
            _run_row(row, factories, measure, options.repeat, progress)
            rows.append(row)

    def throughput(factory: LoaderFactory, *, settle: bool = False) -> Measurement:
        if settle:
            return measure_throughput(factory, window, settle=True)
        return measure_throughput(factory, window)

    def run_variants(
        measure: Callable[..., Measurement], extra: dict[str, Any] | None = None
    ) -> None:
        """conveyor alone with each variant's settings (thread workers, "auto")."""
        if options.stand_in_torch or "conveyor" not in chosen:
            return
        for variant in spec.variants:
            kwargs = {**(extra or {}), **dict(variant.extra)}
            # "auto" is timed once its count settled (not in a quick run: that takes seconds);
            # how long it took is the row's note.
            settle = variant.workers == "auto" and not options.quick
            timed = functools.partial(measure, settle=True) if settle else measure
            # Settling takes seconds of batches before the window: the samples, many times over.
            data = Repeated(dataset, SETTLE_REPEATS) if settle else dataset
            row, factories = loader_row(
                variant.label, "variant", 1, extra=kwargs, names=("conveyor",)
            )
            factories["conveyor"] = _loader_factory(
                loaders.classes["conveyor"], data, spec, variant.workers, method, kwargs
            )
            run(row, factories, timed)

    def epochs(factory: LoaderFactory) -> Measurement:
        return measure_epochs(factory, window)

    if spec.kind == "startup":
        for row_method in methods:
            config = f"{_config_label(spec, row_method)}, {len(dataset):,} paths"
            row, factories = loader_row(config, "startup", spec.num_workers, row_method)
            run(row, factories, measure_startup)
    elif spec.kind == "train":
        accelerator = Accelerator.find()
        pinned = {"pin_memory": True} if accelerator is not None else {}
        where = f"pin_memory, copy to {accelerator.device}" if accelerator else "no accelerator"
        step = f"{1000 * spec.step_s:g} ms step" + (" of Python" if spec.step_holds_gil else "")
        config = f"{_config_label(spec, method)}, {step}, {where}"
        row, factories = loader_row(config, "train", spec.num_workers, extra=pinned)
        spins = calibrate_spin(spec.step_s) if spec.step_holds_gil else 0

        def train(factory: LoaderFactory, *, settle: bool = False) -> Measurement:
            return measure_training(
                factory, window, spec.step_s, accelerator, settle=settle, spin_iterations=spins
            )

        run(row, factories, train)
        run_variants(train, extra=pinned)
    elif spec.kind == "memory":
        for step_s in spec.memory_steps:
            step = f"{1000 * step_s:g} ms step" if step_s else "no step"
            for count in spec.worker_counts:
                config = f"{count} workers, persistent, prefetch_factor=2, {step}"
                row, factories = loader_row(config, "memory", count)
                run(
                    row,
                    factories,
                    functools.partial(measure_training, window=window, step_s=step_s),
                )
    elif spec.kind == "epochs":
        batches = len(dataset) // spec.batch_size
        for row_method in methods:
            config = f"{_config_label(spec, row_method)}, {batches} batches an epoch"
            row, factories = loader_row(config, "epochs", spec.num_workers, row_method)
            run(row, factories, epochs)
    else:
        names = ALL_LOADERS if spec.alternatives else LOADERS
        row, factories = loader_row(
            _config_label(spec, method), "throughput", spec.num_workers, names=names
        )
        run(row, factories, throughput)
        run_variants(throughput)
        if spec.inline_rows:
            row, factories = loader_row(INLINE_CONFIG, "throughput", 0)
            run(row, factories, throughput)
        if spec.features_row and not options.stand_in_torch and "conveyor" in chosen:
            config = f"{_config_label(spec, method)}, reseed='batch', on_error='skip', "
            config += "snapshot every step"
            row, factories = loader_row(
                config, "features", spec.num_workers, extra=FEATURES, names=("conveyor",)
            )
            run(row, factories, throughput)
        if spec.plain_row:
            row = Row(spec.name, spec.plain_label, "baseline")
            plain: Factories = {PLAIN: lambda: PlainLoop(dataset, spec.batch_size, spec.collate_fn)}
            _run_row(row, plain, throughput, options.repeat, progress)
            # --quick checks the machine only where a target rests on it (a smoke test).
            if not options.quick or spec.target_speedup or spec.machine_target:
                row.machine = _machine_check(spec, dataset, options, progress)
            rows.append(row)
        if spec.reference_row:
            config = f"reference loop, {spec.num_workers} fork workers, shared memory"
            row = Row(spec.name, config, "reference")
            reference: Factories = {
                REFERENCE: lambda: SharedMemoryLoop(dataset, spec.batch_size, spec.num_workers)
            }
            run(row, reference, throughput)
    annotate(spec, rows)
    return rows


def _run_remote(
    spec: WorkloadSpec, options: BenchOptions, loaders: _Loaders, progress: _Progress
) -> list[Row]:
    """The ``ray`` workload's rows (benchmark/remote.py), or one saying why it was skipped."""
    from conveyor_bench import remote

    why = remote.skipped(options.stand_in_torch or "conveyor" not in loaders.classes)
    if why is not None:
        progress(f"[{spec.name}] skipped: {why}")
        return [Row(spec.name, "Ray workers", "throughput", notes=[f"skipped: {why}"])]
    window = spec.window(options.quick, options.seconds)

    def run(config: str, factories: Factories) -> Row:
        row = Row(spec.name, config, "throughput")
        measure = functools.partial(remote.measure_remote, window=window)
        _run_row(row, factories, measure, options.repeat, progress)
        return row

    try:
        rows = remote.run_remote_rows(spec, window, loaders.classes["conveyor"], run, options)
    except Exception as exc:  # no Pillow, or Ray would not start: the row says why
        progress(f"[{spec.name}] FAILED: {_failure(exc)}")
        return [Row(spec.name, "Ray workers", "throughput", errors={"conveyor": _failure(exc)})]
    annotate(spec, rows)  # leftover processes, failures
    return rows


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def _machine_check(
    spec: WorkloadSpec, dataset: MapDataset, options: BenchOptions, progress: _Progress
) -> MachineCheck | None:
    """The plain loop in ``spec.num_workers`` bare processes side by side against one."""
    size = spec.batch_size

    def loop(batches: int) -> PlainLoop:
        return PlainLoop(dataset, size, spec.collate_fn, batches=batches)

    seconds = _MACHINE_CHECK_S[1] if options.quick else _MACHINE_CHECK_S[0]
    try:
        rounds = 1 if options.quick else 3
        least = 1 if options.quick else 2  # decode: a batch alone may pass the seconds
        check = machine_check(loop, spec.num_workers, seconds, len(dataset) // size, rounds, least)
    except Exception as exc:  # the rows stand without it
        progress(f"  {spec.name} | machine check | FAILED {_failure(exc)}")
        return None
    progress(
        f"  {spec.name} | machine check | {check.processes} processes: {check.speedup:.2f}x, "
        f"{check.batches} batches each"
    )
    return check


def run_benchmark(options: BenchOptions, progress: TextIO | None = sys.stderr) -> BenchReport:
    """Run every workload in ``options``; progress lines go to ``progress`` (None: silent)."""
    loaders = _resolve_loaders(options)
    if not any(name in loaders.classes for name in LOADERS):
        raise RuntimeError(
            "neither conveyor.DataLoader nor torch.utils.data.DataLoader can be imported: "
            + "; ".join(f"{k}: {loaders.descriptions[k]}" for k in LOADERS)
        )
    torch: Any = sys.modules.get("torch")
    previous_threads = torch.get_num_threads() if torch else None
    if torch:  # intra-op threads in the main process would compete with the workers' cores
        torch.set_num_threads(1)
    try:
        environment = describe_environment(
            loaders, f"1 (was {previous_threads})" if torch else "n/a (torch not imported)"
        )
        say = _Progress(progress)
        rows: list[Row] = []
        with warnings.catch_warnings():
            # torch warns when num_workers > cores; the latency workload asks for that.
            warnings.filterwarnings("ignore", _TORCH_WORKER_WARNING, UserWarning)
            for name in options.workloads:
                rows.extend(_run_workload(WORKLOADS[name], options, loaders, say))
    finally:
        if torch and previous_threads:
            torch.set_num_threads(previous_threads)
    return BenchReport(environment, options, rows)
