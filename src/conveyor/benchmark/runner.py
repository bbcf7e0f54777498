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
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal, TextIO

from conveyor.benchmark.measure import (
    Accelerator,
    LoaderFactory,
    Measurement,
    PlainLoop,
    cpu_count_line,
    measure_epochs,
    measure_startup,
    measure_throughput,
    measure_training,
    parallel_speedup,
)
from conveyor.benchmark.reference import SharedMemoryLoop
from conveyor.benchmark.workloads import (
    WORKLOADS,
    CpuDataset,
    MapDataset,
    WorkloadSpec,
    spin_many,
)

LOADERS = ("conveyor", "torch")
PLAIN = "plain"
REFERENCE = "reference"
INLINE_CONFIG = "num_workers=0"  # the config of a workload's in-process row
_TORCH_WORKER_WARNING = r"This DataLoader will create \d+ worker processes in total"

RowKind = Literal["throughput", "startup", "epochs", "train", "baseline", "reference", "features"]
TIMED_KINDS = ("startup", "epochs")  # rows whose figure is seconds: lower is better
# conveyor's per-batch features, all on: what they cost is the gap to the workers row.
FEATURES: dict[str, Any] = {"reseed": "batch", "snapshot_every_n_steps": 1, "on_error": "skip"}
LoaderClass = Callable[..., Iterable[Any]]
Factories = dict[str, LoaderFactory]


@dataclass(frozen=True)
class BenchOptions:
    """What to run; validated on creation."""

    workloads: tuple[str, ...] = tuple(WORKLOADS)
    quick: bool = False
    repeat: int = 3
    start_method: str | None = None
    stand_in_torch: bool = False
    seconds: float = 3.0

    def __post_init__(self) -> None:
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


@dataclass
class Row:
    """One line of the table: a workload in one configuration, every loader's runs."""

    workload: str
    config: str
    kind: RowKind
    runs: dict[str, list[Measurement]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def timed(self) -> bool:
        """Whether the figure is seconds (lower is better) rather than samples/s."""
        return self.kind in TIMED_KINDS

    def values(self, loader: str) -> list[float]:
        """One figure per round: samples/s, seconds to first batch (startup) or seconds
        per epoch (epochs)."""
        runs = self.runs.get(loader, [])
        if self.kind == "startup":
            return [m.seconds for m in runs]
        if self.kind == "epochs":
            return [m.seconds_per_epoch or 0.0 for m in runs]
        return [m.samples_per_s for m in runs]

    def median(self, loader: str) -> float | None:
        """The median over the rounds of ``values(loader)``; None if it failed or never ran."""
        values = self.values(loader)
        if not values or loader in self.errors:
            return None
        return statistics.median(values)

    def spread(self, loader: str) -> float | None:
        """How far the farthest round is from the median, as a share of it (0.03: every
        round within 3%); None with fewer than two rounds."""
        values, median = self.values(loader), self.median(loader)
        if len(values) < 2 or not median:
            return None
        return max(abs(v - median) for v in values) / median

    def ratio(self) -> float | None:
        """conveyor's speedup over torch (higher is better for conveyor)."""
        mine, theirs = self.median("conveyor"), self.median("torch")
        if mine is None or theirs is None or mine <= 0 or theirs <= 0:
            return None
        return theirs / mine if self.timed else mine / theirs


@dataclass
class BenchReport:
    environment: dict[str, str]
    options: BenchOptions
    rows: list[Row]


@dataclass(frozen=True)
class _Loaders:
    classes: dict[str, LoaderClass]
    descriptions: dict[str, str]


def _resolve_loaders(stand_in_torch: bool) -> _Loaders:
    classes: dict[str, LoaderClass] = {}
    described: dict[str, str] = {}
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
        "conveyor column": loaders.descriptions.get("conveyor", "-"),
        "torch column": loaders.descriptions.get("torch", "-"),
        "default start method": default_method,
        "torch threads in main process": torch_threads,
    }


def _loader_factory(
    cls: LoaderClass,
    dataset: MapDataset,
    spec: WorkloadSpec,
    workers: int,
    method: str | None,
    extra: dict[str, Any] | None = None,
) -> LoaderFactory:
    kwargs: dict[str, Any] = {"batch_size": spec.batch_size, "shuffle": False, **(extra or {})}
    if workers:
        kwargs.update(
            num_workers=workers,
            persistent_workers=spec.persistent_workers,
            multiprocessing_context=method,
        )
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
                row.errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
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


def _rate(row: Row, loader: str) -> str:
    """A row's median samples/s for a note, with its spread over the rounds if any."""
    spread = row.spread(loader)
    text = f"{row.median(loader) or 0:,.0f} samples/s"
    return text if spread is None else f"{text} ±{spread:.0%}"


def _annotate(spec: WorkloadSpec, rows: list[Row], scaling: float | None) -> None:
    plain = next((r for r in rows if r.kind == "baseline"), None)
    base = plain.median(PLAIN) if plain else None
    reference_row = next((r for r in rows if r.kind == "reference"), None)
    reference = reference_row.median(REFERENCE) if reference_row else None
    inline = next((r for r in rows if r.config == INLINE_CONFIG), None)
    workers = next((r for r in rows if r.kind == "throughput" and r is not inline), None)
    for row in rows:
        plain_workers = workers.median("conveyor") if workers else None
        if row.kind == "features" and (v := row.median("conveyor")) and plain_workers:
            row.notes.append(
                f"of the same loader without them: {v / plain_workers:.0%} (target >= 90%)"
            )
        workers_row = row.kind == "throughput" and row is not inline
        if workers_row and reference:
            shares = [f"{n} {v / reference:.0%}" for n in LOADERS if (v := row.median(n))]
            row.notes.append(f"of reference loop: {', '.join(shares)} (target >= 90%)")
        if workers_row and inline is not None:
            shares = [
                f"{n} {v / w:.2f}x"
                for n in LOADERS
                if (v := row.median(n)) and (w := inline.median(n))
            ]
            row.notes.append(f"vs its num_workers=0: {', '.join(shares)}")
        if row.kind == "reference" and reference:
            row.notes.append(
                f"{_rate(row, REFERENCE)}; the design's limit here: workers write samples "
                "into shared memory, views to the consumer, nothing else"
            )
        if row.kind == "baseline" and base:
            row.notes.append(f"{_rate(row, PLAIN)}; no loader: index + collate by hand (NumPy)")
            if scaling:
                row.notes.append(
                    f"machine check: {spec.num_workers} bare processes of this work ran "
                    f"{scaling:.2f}x one (the most {spec.num_workers} workers can reach here)"
                )
        elif row.kind == "startup":
            row.notes.append("time to first batch, lower is better; ratio = torch / conveyor")
        elif row.kind == "epochs":
            row.notes.append(
                "time an epoch takes, its workers' start-up included, lower is better; "
                "ratio = torch / conveyor"
            )
        elif base and row.kind == "throughput":
            if spec.target_speedup:
                shares = [f"{n} {v / base:.2f}x" for n in LOADERS if (v := row.median(n))]
                target = f"target >= {spec.target_speedup}x"
                row.notes.append(f"vs single process: {', '.join(shares)} ({target})")
            else:
                shares = [f"{n} {v / base:.0%}" for n in LOADERS if (v := row.median(n))]
                row.notes.append(f"of plain loop: {', '.join(shares)}")
        if row.kind == "train":
            row.notes.extend(_training_notes(row))
        if spec.ideal_samples_per_s and row.kind in ("throughput", "train"):
            ideal = spec.ideal_samples_per_s
            shares = [f"{n} {v / ideal:.0%}" for n in LOADERS if (v := row.median(n))]
            row.notes.append(f"of ideal {ideal:,.0f}/s: {', '.join(shares)}")
        for name, runs in row.runs.items():
            leaked = max(m.leaked_processes for m in runs)
            if leaked:
                row.notes.append(f"{name}: {leaked} process(es) outlived the loader")
        row.notes.extend(f"{name} failed: {error}" for name, error in row.errors.items())


def _training_notes(row: Row) -> list[str]:
    """How long the training loop waited for data, and how fast batches reached the
    accelerator (median over the rounds)."""
    waited, copies = [], []
    for name in LOADERS:
        runs = row.runs.get(name)
        if not runs or name in row.errors:
            continue
        waited.append(f"{name} {statistics.median(m.waited_share for m in runs):.1%}")
        rates = [rate for m in runs if (rate := m.copy_bytes_per_s) is not None]
        if rates:
            copies.append(f"{name} {statistics.median(rates) / 1e9:.1f} GB/s")
    notes = [f"waiting for data: {', '.join(waited)} of the loop"] if waited else []
    if copies:
        notes.append(f"copy to the accelerator: {', '.join(copies)}")
    return notes


def _run_workload(
    spec: WorkloadSpec, options: BenchOptions, loaders: _Loaders, progress: _Progress
) -> list[Row]:
    methods = _row_methods(spec, options)
    method = methods[0] if methods else None
    window = spec.window(options.quick, options.seconds)
    length = spec.fixed_length or (window.warmup + window.max_batches) * spec.batch_size
    dataset = spec.make_dataset(length, options.quick)
    progress(f"[{spec.name}] dataset of {len(dataset):,} samples")
    gc.collect()  # what came before is gone; each run collects its own loader after it
    rows: list[Row] = []

    def loader_row(
        config: str,
        kind: RowKind,
        workers: int,
        method: str | None = method,
        extra: dict[str, Any] | None = None,
    ) -> tuple[Row, dict[str, LoaderFactory]]:
        factories = {
            name: _loader_factory(loaders.classes[name], dataset, spec, workers, method, extra)
            for name in LOADERS
            if name in loaders.classes
        }
        return Row(spec.name, config, kind), factories

    def throughput(factory: LoaderFactory) -> Measurement:
        return measure_throughput(factory, window)

    def epochs(factory: LoaderFactory) -> Measurement:
        return measure_epochs(factory, window)

    if spec.kind == "startup":
        for row_method in methods:
            config = f"{_config_label(spec, row_method)}, {len(dataset):,} paths"
            row, factories = loader_row(config, "startup", spec.num_workers, row_method)
            _run_row(row, factories, measure_startup, options.repeat, progress)
            rows.append(row)
    elif spec.kind == "train":
        accelerator = Accelerator.find()
        pinned = {"pin_memory": True} if accelerator is not None else {}
        where = f"pin_memory, copy to {accelerator.device}" if accelerator else "no accelerator"
        config = f"{_config_label(spec, method)}, {1000 * spec.step_s:g} ms step, {where}"
        row, factories = loader_row(config, "train", spec.num_workers, extra=pinned)

        def train(factory: LoaderFactory) -> Measurement:
            return measure_training(factory, window, spec.step_s, accelerator)

        _run_row(row, factories, train, options.repeat, progress)
        rows.append(row)
    elif spec.kind == "epochs":
        batches = len(dataset) // spec.batch_size
        for row_method in methods:
            config = f"{_config_label(spec, row_method)}, {batches} batches an epoch"
            row, factories = loader_row(config, "epochs", spec.num_workers, row_method)
            _run_row(row, factories, epochs, options.repeat, progress)
            rows.append(row)
    else:
        plan = [(_config_label(spec, method), spec.num_workers)]
        if spec.inline_rows:
            plan.append((INLINE_CONFIG, 0))
        for config, workers in plan:
            row, factories = loader_row(config, "throughput", workers)
            _run_row(row, factories, throughput, options.repeat, progress)
            rows.append(row)
        if spec.features_row and not options.stand_in_torch:
            config = f"{plan[0][0]}, reseed='batch', on_error='skip', snapshot every step"
            row = Row(spec.name, config, "features")
            featured = _loader_factory(
                loaders.classes["conveyor"], dataset, spec, spec.num_workers, method, FEATURES
            )
            _run_row(row, {"conveyor": featured}, throughput, options.repeat, progress)
            rows.append(row)
        if spec.plain_row:
            row = Row(spec.name, spec.plain_label, "baseline")
            plain: Factories = {PLAIN: lambda: PlainLoop(dataset, spec.batch_size)}
            _run_row(row, plain, throughput, options.repeat, progress)
            rows.append(row)
        if spec.reference_row:
            config = f"reference loop, {spec.num_workers} fork workers, shared memory"
            row = Row(spec.name, config, "reference")
            reference: Factories = {
                REFERENCE: lambda: SharedMemoryLoop(dataset, spec.batch_size, spec.num_workers)
            }
            _run_row(row, reference, throughput, options.repeat, progress)
            rows.append(row)
    scaling = None
    if isinstance(dataset, CpuDataset):
        count = 20 if options.quick else 300  # ~0.3 s of work per process
        probe = functools.partial(spin_many, dataset.iterations, count)
        scaling = parallel_speedup(probe, spec.num_workers, pairs=1 if options.quick else 3)
        progress(f"  {spec.name} | machine check | {spec.num_workers} processes: {scaling:.2f}x")
    _annotate(spec, rows, scaling)
    return rows


def run_benchmark(options: BenchOptions, progress: TextIO | None = sys.stderr) -> BenchReport:
    """Run every workload in ``options``; progress lines go to ``progress`` (None: silent)."""
    loaders = _resolve_loaders(options.stand_in_torch)
    if not loaders.classes:
        raise RuntimeError(
            "neither conveyor.DataLoader nor torch.utils.data.DataLoader can be imported: "
            + "; ".join(f"{k}: {v}" for k, v in loaders.descriptions.items())
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
