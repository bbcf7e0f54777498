"""What a workload is: its dataset, loader settings, timed window, the rows it runs and the
targets its figures are held to. The workloads themselves are
:mod:`conveyor_bench.catalogue`'s; their datasets :mod:`conveyor_bench.workloads`'."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from conveyor_bench.workloads import MapDataset

Kind = Literal["throughput", "startup", "epochs", "train", "ray", "memory"]


@dataclass(frozen=True)
class Variant:
    """A row of conveyor alone with other settings: ``label``, the worker count (an int,
    or "auto") and the extra loader arguments (thread workers, say)."""

    label: str
    workers: int | str
    extra: tuple[tuple[str, Any], ...] = ()
    cores: int | None = None  # workers serving at once, when not ``workers`` (threads in each)


@dataclass(frozen=True)
class WindowSpec:
    """A timed window: after ``warmup`` batches, run until ``min_batches`` are timed and
    ``seconds`` have passed, stopping at ``max_batches`` in any case. For the ``epochs`` kind
    the counts are of epochs."""

    warmup: int
    min_batches: int
    max_batches: int
    seconds: float
    measure_memory: bool = False  # read the process tree's memory (PSS) at the window's end
    # Batches before the window (after warm-up) whose main-process calls are counted.
    count_calls: int = 0
    # Sample the process tree's memory (PSS) all through the window: its peak.
    peak_memory: bool = False


# Batches whose main-process calls a throughput run counts, after warm-up and before its
# window (few: under the profile hook they run several times slower; the count is the
# same every batch).
CALL_BATCHES, QUICK_CALL_BATCHES = 50, 5


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload: its dataset and the loader settings and comparisons it runs.

    ``make_dataset(length, quick)`` builds the dataset. A timed window runs until it has
    ``min_batches`` batches and the target seconds have passed, or ``max_batches`` (the
    dataset's end; sized for >= 3 s on a 2-core machine); ``--quick`` times ``quick_batches``
    after ``quick_warmup`` (default: ``warmup``), or, with ``quick_seconds``, as many as fit
    in that time, at least one. An ``epochs`` workload counts epochs instead of batches.
    """

    name: str
    summary: str
    kind: Kind
    make_dataset: Callable[[int, bool], MapDataset]
    batch_size: int
    num_workers: int
    persistent_workers: bool = False
    max_batches: int = 0
    quick_batches: int = 0
    min_batches: int = 10
    warmup: int = 5
    quick_warmup: int | None = None
    quick_seconds: float = 0.0
    inline_rows: bool = False  # also num_workers=0 for both loaders
    plain_row: bool = False  # also a plain in-process loop: index + collate by hand
    plain_label: str = "plain loop, no loader (ceiling)"
    reference_row: bool = False  # also the reference shared-memory loop (benchmark/reference.py)
    features_row: bool = False  # also conveyor with its per-batch features on (runner.FEATURES)
    alternatives: bool = False  # SPDL and Grain join the workers row (map-style, fixed shapes)
    collate_fn: Callable[[Any], Any] | None = None  # the loaders' and the plain loop's
    ideal_samples_per_s: float | None = None
    # Targets for conveyor's workers row: over the plain loop (a single process; with
    # machine_target, the machine check's figure is the target), over its own
    # num_workers=0, as a share of the reference loop, and over torch.
    target_speedup: float | None = None
    machine_target: bool = False
    target_vs_inline: float | None = None
    target_of_reference: float = 0.9
    target_vs_torch: float = 1.0
    # CPU per batch over the reference loop's, at most (issue 36): the main process's and
    # the workers'.
    target_main_of_reference: float | None = None
    target_workers_of_reference: float | None = None
    seconds_scale: float = 1.0  # the timed window: this share of --seconds
    in_quick: bool = True  # run by --quick without --workloads (heavy ones are left out)
    # A row per start method, in this order; empty: one row, with the method asked for.
    start_methods: tuple[str, ...] = ()
    # --quick's rows (empty: start_methods'): a spawned torch worker imports torch, seconds.
    quick_start_methods: tuple[str, ...] = ()
    fixed_length: int | None = None  # startup: paths (quick: a tenth); epochs: samples/epoch
    step_s: float = 0.0  # train: each batch's training step (the host waiting for the GPU)
    step_holds_gil: bool = False  # train: the step is Python holding the GIL, not a sleep
    variants: tuple[Variant, ...] = ()  # rows of conveyor alone, other settings
    # A worker's own limit (samples/s it can give: one over a sample's wait), for the
    # share of the ideal each row reaches whatever its worker count.
    per_worker_ideal: float | None = None
    by_default: bool = True  # run without --workloads (ray: only when named)
    # Each row says what memory its loader's processes held (worker kinds compared).
    measure_memory: bool = False
    # memory: a row per worker count, conveyor and torch, each run's peak memory added;
    # conveyor's over torch's, at most this (issue 40).
    worker_counts: tuple[int, ...] = ()
    target_memory_of_torch: float | None = None
    # memory: the training step after each batch, a row set each: none (the loaders run
    # flat out: conveyor's prefetch fills, torch's may not) and one long enough that both
    # fill it (what each holds at the same prefetch_factor).
    memory_steps: tuple[float, ...] = (0.0, 0.3)

    def __post_init__(self) -> None:
        timed = self.kind in ("throughput", "epochs", "train", "ray", "memory")
        if timed and not 1 <= self.min_batches <= self.max_batches:
            raise ValueError(
                f"workload {self.name!r}: need 1 <= min_batches ({self.min_batches}) "
                f"<= max_batches ({self.max_batches})"
            )
        if timed and self.quick_batches < 1:
            raise ValueError(f"workload {self.name!r}: quick_batches must be >= 1")

    def window(self, quick: bool, seconds: float) -> WindowSpec:
        """The timed window of a run: ``--quick``'s, or one of ``seconds``."""
        calls = 0 if self.kind != "throughput" else QUICK_CALL_BATCHES if quick else CALL_BATCHES
        peak = self.kind == "memory"
        if not quick:
            return WindowSpec(
                self.warmup,
                self.min_batches,
                self.max_batches,
                seconds * self.seconds_scale,
                self.measure_memory,
                calls,
                peak,
            )
        warmup = self.warmup if self.quick_warmup is None else self.quick_warmup
        least = 1 if self.quick_seconds else self.quick_batches
        return WindowSpec(
            warmup, least, self.quick_batches, self.quick_seconds, self.measure_memory, calls, peak
        )
