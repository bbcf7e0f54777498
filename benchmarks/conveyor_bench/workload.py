"""One workload's rows: its dataset built once, then each row's loaders in rounds.

:func:`run_workload` builds the dataset and hands it to a :class:`WorkloadRun`, whose
methods make the rows of each kind of workload (throughput, startup, epochs, train); the
``ray`` workload's rows are :mod:`conveyor_bench.remote`'s.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import Any

from conveyor_bench.loaders import Loaders, config_label, loader_factory, row_methods
from conveyor_bench.machine import MachineCheck, machine_check
from conveyor_bench.measure import (
    Accelerator,
    LoaderFactory,
    Measurement,
    PlainLoop,
    measure_epochs,
    measure_startup,
    measure_throughput,
    measure_training,
)
from conveyor_bench.notes import annotate
from conveyor_bench.options import ALL_LOADERS, BenchOptions
from conveyor_bench.reference import SharedMemoryLoop
from conveyor_bench.rounds import Factories, Progress, failure, run_row
from conveyor_bench.rows import (
    ALTERNATIVES,
    INLINE_CONFIG,
    LOADERS,
    NOT_INSTALLED,
    PLAIN,
    REFERENCE,
    Row,
    RowKind,
)
from conveyor_bench.specs import WindowSpec, WorkloadSpec
from conveyor_bench.workloads import MapDataset, Repeated, calibrate_spin

__all__ = ["FEATURES", "SETTLE_REPEATS", "run_workload"]

SETTLE_REPEATS = 1000  # a window's dataset over again, for the seconds 'auto' takes to settle
_MACHINE_CHECK_S = (0.3, 0.05)  # each process's run in the machine check: full, --quick
# conveyor's per-batch features, all on: what they cost is the gap to the workers row.
FEATURES: dict[str, Any] = {"reseed": "batch", "snapshot_every_n_steps": 1, "on_error": "skip"}


def run_workload(
    spec: WorkloadSpec, options: BenchOptions, loaders: Loaders, progress: Progress
) -> list[Row]:
    if spec.kind == "ray":
        return _run_remote(spec, options, loaders, progress)
    methods = row_methods(spec, options)
    method = methods[0] if methods else None
    window = spec.window(options.quick, options.seconds)
    # (and room for the batches whose calls are counted before the window)
    batches = window.warmup + window.max_batches + window.count_calls
    length = spec.fixed_length or batches * spec.batch_size
    try:
        dataset = spec.make_dataset(length, options.quick)
    except Exception as exc:  # e.g. decode without Pillow: this workload's row says why
        row = Row(spec.name, config_label(spec, method), "throughput")
        if getattr(exc, "skips_workload", False):  # torchvision's rows without torchvision
            row.notes.append(f"skipped: {exc}")
        else:
            row.errors = {name: failure(exc) for name in LOADERS if name in loaders.classes}
        progress(f"[{spec.name}] {row.notes[0] if row.notes else 'FAILED: ' + failure(exc)}")
        annotate(spec, [row])
        return [row]
    progress(f"[{spec.name}] dataset of {len(dataset):,} samples")
    gc.collect()  # what came before is gone; each run collects its own loader after it
    run = WorkloadRun(spec, options, loaders, progress, dataset, methods, window)
    if spec.kind == "startup":
        run.startup_rows()
    elif spec.kind == "train":
        run.train_rows()
    elif spec.kind == "epochs":
        run.epoch_rows()
    elif spec.kind == "memory":
        run.memory_rows()
    else:
        run.throughput_rows()
    annotate(spec, run.rows)
    return run.rows


class WorkloadRun:
    """The rows of one workload over its dataset, as they are measured."""

    def __init__(
        self,
        spec: WorkloadSpec,
        options: BenchOptions,
        loaders: Loaders,
        progress: Progress,
        dataset: MapDataset,
        methods: list[str | None],
        window: WindowSpec,
    ) -> None:
        self.spec, self.options, self.loaders, self.progress = spec, options, loaders, progress
        self.dataset, self.methods, self.window = dataset, methods, window
        self.method = methods[0] if methods else None
        self.chosen = options.chosen_loaders
        self.rows: list[Row] = []

    def loader_row(
        self,
        config: str,
        kind: RowKind,
        workers: int,
        method: str | None,
        extra: dict[str, Any] | None = None,
        names: tuple[str, ...] = LOADERS,
    ) -> tuple[Row, Factories]:
        """A row and a factory for each of ``names`` chosen and importable here."""
        row, factories = Row(self.spec.name, config, kind), {}
        for name in names:
            if name not in self.chosen:
                continue
            if name not in self.loaders.classes:
                if name in ALTERNATIVES:
                    row.missing[name] = self.loaders.descriptions.get(name, NOT_INSTALLED)
                continue
            cls = self.loaders.classes[name]
            factories[name] = loader_factory(cls, self.dataset, self.spec, workers, method, extra)
        return row, factories

    def run(self, row: Row, factories: Factories, measure: Callable[..., Measurement]) -> None:
        """Run the row's loaders; keep the row if any ran or one is missing here."""
        if factories or row.missing:
            run_row(row, factories, measure, self.options.repeat, self.progress)
            self.rows.append(row)

    def throughput(self, factory: LoaderFactory, *, settle: bool = False) -> Measurement:
        if settle:
            return measure_throughput(factory, self.window, settle=True)
        return measure_throughput(factory, self.window)

    def variants(
        self, measure: Callable[..., Measurement], extra: dict[str, Any] | None = None
    ) -> None:
        """conveyor alone with each variant's settings (thread workers, "auto")."""
        if self.options.stand_in_torch or "conveyor" not in self.chosen:
            return
        for variant in self.spec.variants:
            kwargs = {**(extra or {}), **dict(variant.extra)}
            # "auto" is timed once its count settled (not in a quick run: that takes seconds);
            # how long it took is the row's note.
            settle = variant.workers == "auto" and not self.options.quick
            timed = functools.partial(measure, settle=True) if settle else measure
            # Settling takes seconds of batches before the window: the samples, many times over.
            data = Repeated(self.dataset, SETTLE_REPEATS) if settle else self.dataset
            row, factories = self.loader_row(
                variant.label, "variant", 1, self.method, kwargs, ("conveyor",)
            )
            factories["conveyor"] = loader_factory(
                self.loaders.classes["conveyor"], data, self.spec, variant.workers, self.method,
                kwargs,
            )  # fmt: skip
            self.run(row, factories, timed)

    def startup_rows(self) -> None:
        for method in self.methods:
            config = f"{config_label(self.spec, method)}, {len(self.dataset):,} paths"
            row, factories = self.loader_row(config, "startup", self.spec.num_workers, method)
            self.run(row, factories, measure_startup)

    def epoch_rows(self) -> None:
        batches = len(self.dataset) // self.spec.batch_size

        def epochs(factory: LoaderFactory) -> Measurement:
            return measure_epochs(factory, self.window)

        for method in self.methods:
            config = f"{config_label(self.spec, method)}, {batches} batches an epoch"
            row, factories = self.loader_row(config, "epochs", self.spec.num_workers, method)
            self.run(row, factories, epochs)

    def train_rows(self) -> None:
        spec = self.spec
        accelerator = Accelerator.find()
        pinned = {"pin_memory": True} if accelerator is not None else {}
        where = f"pin_memory, copy to {accelerator.device}" if accelerator else "no accelerator"
        step = f"{1000 * spec.step_s:g} ms step" + (" of Python" if spec.step_holds_gil else "")
        config = f"{config_label(spec, self.method)}, {step}, {where}"
        row, factories = self.loader_row(config, "train", spec.num_workers, self.method, pinned)
        spins = calibrate_spin(spec.step_s) if spec.step_holds_gil else 0

        def train(factory: LoaderFactory, *, settle: bool = False) -> Measurement:
            return measure_training(
                factory, self.window, spec.step_s, accelerator, settle=settle, spin_iterations=spins
            )

        self.run(row, factories, train)
        self.variants(train, extra=pinned)

    def memory_rows(self) -> None:
        """A row per worker count, flat out and with each training step: the memory each
        loader adds at its peak (see specs.WorkloadSpec.memory_steps)."""
        spec = self.spec
        for step_s in spec.memory_steps:
            step = f"{1000 * step_s:g} ms step" if step_s else "no step"
            for count in spec.worker_counts:
                config = f"{count} workers, persistent, prefetch_factor=2, {step}"
                row, factories = self.loader_row(config, "memory", count, self.method)
                stepped = functools.partial(measure_training, window=self.window, step_s=step_s)
                self.run(row, factories, stepped)

    def throughput_rows(self) -> None:
        spec, label = self.spec, config_label(self.spec, self.method)
        names = ALL_LOADERS if spec.alternatives else LOADERS
        row, factories = self.loader_row(
            label, "throughput", spec.num_workers, self.method, names=names
        )
        self.run(row, factories, self.throughput)
        self.variants(self.throughput)
        if spec.inline_rows:
            row, factories = self.loader_row(INLINE_CONFIG, "throughput", 0, self.method)
            self.run(row, factories, self.throughput)
        if spec.features_row and not self.options.stand_in_torch and "conveyor" in self.chosen:
            config = f"{label}, reseed='batch', on_error='skip', snapshot every step"
            row, factories = self.loader_row(
                config, "features", spec.num_workers, self.method, FEATURES, ("conveyor",)
            )
            self.run(row, factories, self.throughput)
        if spec.plain_row:
            self.plain_row()
        if spec.reference_row:
            config = f"reference loop, {spec.num_workers} fork workers, shared memory"
            dataset, size, workers = self.dataset, spec.batch_size, spec.num_workers
            reference: Factories = {REFERENCE: lambda: SharedMemoryLoop(dataset, size, workers)}
            self.run(Row(spec.name, config, "reference"), reference, self.throughput)

    def plain_row(self) -> None:
        spec, dataset = self.spec, self.dataset
        row = Row(spec.name, spec.plain_label, "baseline")
        plain: Factories = {PLAIN: lambda: PlainLoop(dataset, spec.batch_size, spec.collate_fn)}
        run_row(row, plain, self.throughput, self.options.repeat, self.progress)
        # --quick checks the machine only where a target rests on it (a smoke test).
        if not self.options.quick or spec.target_speedup or spec.machine_target:
            row.machine = _machine_check(spec, dataset, self.options, self.progress)
        self.rows.append(row)


def _run_remote(
    spec: WorkloadSpec, options: BenchOptions, loaders: Loaders, progress: Progress
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
        run_row(row, factories, measure, options.repeat, progress)
        return row

    try:
        rows = remote.run_remote_rows(spec, window, loaders.classes["conveyor"], run, options)
    except Exception as exc:  # no Pillow, or Ray would not start: the row says why
        progress(f"[{spec.name}] FAILED: {failure(exc)}")
        return [Row(spec.name, "Ray workers", "throughput", errors={"conveyor": failure(exc)})]
    annotate(spec, rows)  # leftover processes, failures
    return rows


def _machine_check(
    spec: WorkloadSpec, dataset: MapDataset, options: BenchOptions, progress: Progress
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
        progress(f"  {spec.name} | machine check | FAILED {failure(exc)}")
        return None
    progress(
        f"  {spec.name} | machine check | {check.processes} processes: {check.speedup:.2f}x, "
        f"{check.batches} batches each"
    )
    return check
