"""Benchmark workloads: map-style datasets and the loader settings each one runs with.

The datasets are defined at module top level so that they pickle by reference under the
``spawn`` and ``forkserver`` start methods, and this module imports only NumPy, so a spawned
worker that unpickles one pays for nothing else. Every sample is a ``(value, label)`` tuple.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


class MapDataset(Protocol):
    """What the benchmark needs from a dataset: ``len(ds)`` and ``ds[i]``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[Any, int]: ...


def _check_index(index: int, length: int) -> None:
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for a dataset of length {length}")


class TinyDataset:
    """Sample ``i``: (a float32 vector of 16 values, an int label); a row of a small table."""

    def __init__(self, length: int, rows: int = 1024) -> None:
        self.length = length
        self.table = np.random.default_rng(0).standard_normal((rows, 16), dtype=np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        return self.table[index % len(self.table)], index % 10


class ImageDataset:
    """Sample ``i``: (a 3x224x224 uint8 image, an int label), one of a few preallocated images.

    Fetching is nearly free, so the loader's own cost (collate, transfer) dominates.
    """

    shape = (3, 224, 224)

    def __init__(self, length: int, pool: int = 4) -> None:
        self.length = length
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, self.shape, dtype=np.uint8) for _ in range(pool)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        return self.images[index % len(self.images)], index % 1000


def spin(iterations: int) -> int:
    """Pure-Python busy work (holds the GIL): ``iterations`` rounds of integer arithmetic."""
    acc = 0
    for j in range(iterations):
        acc = (acc + j * j) % 1_000_003
    return acc


def spin_many(iterations: int, count: int) -> None:
    """``count`` rounds of ``spin(iterations)``: the cpu workload's work, without a loader."""
    for _ in range(count):
        spin(iterations)


def calibrate_spin(target_s: float = 0.001, trials: int = 7) -> int:
    """How many ``spin`` iterations take ``target_s`` on this machine (best of ``trials``)."""
    probe = 20_000
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        spin(probe)
        best = min(best, time.perf_counter() - start)
    return max(1, round(probe * target_s / best))


class CpuDataset:
    """Sample ``i``: ~1 ms of pure-Python work (``spin``), then an 8-float32 vector and a label.

    ``iterations`` comes from ``calibrate_spin`` in the main process, so each sample costs about
    the same wall time in every worker and in the plain loop.
    """

    def __init__(self, length: int, iterations: int) -> None:
        self.length = length
        self.iterations = iterations

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        acc = spin(self.iterations)
        return np.full(8, acc + index, dtype=np.float32), index % 10


class SleepDataset:
    """Sample ``i``: sleeps ``delay_s`` (I/O stand-in), then an 8-float32 vector and a label."""

    def __init__(self, length: int, delay_s: float = 0.005) -> None:
        self.length = length
        self.delay_s = delay_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        time.sleep(self.delay_s)
        return np.full(8, index, dtype=np.float32), index % 10


class PathListDataset:
    """A dataset holding a Python list of path strings; sample ``i``: (path, ``i``).

    Its pickle is large (tens of MB for 1M paths), which is what makes spawn startup slow.
    """

    def __init__(self, count: int) -> None:
        self.paths = [f"/data/train/{i:07d}.jpg" for i in range(count)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.paths[index], index


def hand_collate(samples: Sequence[tuple[Any, int]]) -> tuple[Any, Array]:
    """Collate by hand for the plain loop: stack the values (arrays) and the labels."""
    values = [value for value, _ in samples]
    labels = np.asarray([label for _, label in samples], dtype=np.int64)
    if isinstance(values[0], np.ndarray):
        return np.stack(values), labels
    return values, labels


Kind = Literal["throughput", "startup", "epochs", "train"]


@dataclass(frozen=True)
class WindowSpec:
    """A timed window: after ``warmup`` batches, run until ``min_batches`` are timed and
    ``seconds`` have passed, stopping at ``max_batches`` in any case. For the ``epochs`` kind
    the counts are of epochs."""

    warmup: int
    min_batches: int
    max_batches: int
    seconds: float


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
    ideal_samples_per_s: float | None = None
    target_speedup: float | None = None  # goal for the workers row over the plain loop
    # A row per start method, in this order; empty: one row, with the method asked for.
    start_methods: tuple[str, ...] = ()
    # --quick's rows (empty: start_methods'): a spawned torch worker imports torch, seconds.
    quick_start_methods: tuple[str, ...] = ()
    fixed_length: int | None = None  # startup: paths (quick: a tenth); epochs: samples/epoch
    step_s: float = 0.0  # train: each batch's training step (the host waiting for the GPU)

    def __post_init__(self) -> None:
        timed = self.kind in ("throughput", "epochs", "train")
        if timed and not 1 <= self.min_batches <= self.max_batches:
            raise ValueError(
                f"workload {self.name!r}: need 1 <= min_batches ({self.min_batches}) "
                f"<= max_batches ({self.max_batches})"
            )
        if timed and self.quick_batches < 1:
            raise ValueError(f"workload {self.name!r}: quick_batches must be >= 1")

    def window(self, quick: bool, seconds: float) -> WindowSpec:
        """The timed window of a run: ``--quick``'s, or one of ``seconds``."""
        if not quick:
            return WindowSpec(self.warmup, self.min_batches, self.max_batches, seconds)
        warmup = self.warmup if self.quick_warmup is None else self.quick_warmup
        least = 1 if self.quick_seconds else self.quick_batches
        return WindowSpec(warmup, least, self.quick_batches, self.quick_seconds)


_CPU_ITERATIONS: list[int] = []


def _cpu_dataset(length: int, quick: bool) -> CpuDataset:
    if not _CPU_ITERATIONS:
        _CPU_ITERATIONS.append(calibrate_spin())
    return CpuDataset(length, _CPU_ITERATIONS[0])


def _paths_dataset(length: int, quick: bool) -> PathListDataset:
    return PathListDataset(length // 10 if quick else length)


WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            name="tiny",
            summary="16-float32 vector + int label per sample; per-batch overhead dominates",
            kind="throughput",
            make_dataset=lambda n, quick: TinyDataset(n),
            batch_size=256,
            num_workers=2,
            persistent_workers=True,
            max_batches=24_000,
            quick_batches=40,
            warmup=10,
            inline_rows=True,
            plain_row=True,
            reference_row=True,
            features_row=True,
        ),
        WorkloadSpec(
            name="image",
            summary="3x224x224 uint8 image + label, fetch is free; bandwidth dominates",
            kind="throughput",
            make_dataset=lambda n, quick: ImageDataset(n),
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=16_000,
            quick_batches=10,
            warmup=6,
            inline_rows=True,
            plain_row=True,
            reference_row=True,
            features_row=True,
        ),
        WorkloadSpec(
            name="cpu",
            summary="~1 ms of pure-Python work per sample; scaling across processes",
            kind="throughput",
            make_dataset=_cpu_dataset,
            batch_size=32,
            num_workers=2,
            max_batches=300,
            quick_batches=4,
            warmup=4,
            plain_row=True,
            plain_label="single process, plain loop",
            target_speedup=1.8,
        ),
        WorkloadSpec(
            name="latency",
            summary="5 ms sleep per sample; 8 workers should overlap to 1600 samples/s",
            kind="throughput",
            make_dataset=lambda n, quick: SleepDataset(n),
            batch_size=16,
            num_workers=8,
            max_batches=400,
            quick_batches=10,
            warmup=16,
            ideal_samples_per_s=8 / 0.005,
        ),
        WorkloadSpec(
            name="train",
            summary="image batches into a training loop whose step takes 5 ms (the host "
            "waiting for a GPU); with an accelerator also pin_memory=True and the copy to it",
            kind="train",
            make_dataset=lambda n, quick: ImageDataset(n),
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=2_000,
            quick_batches=10,
            warmup=6,
            step_s=0.005,
            ideal_samples_per_s=64 / 0.005,
        ),
        WorkloadSpec(
            name="startup",
            summary="time to first batch, spawn, a list of 1M path strings (--quick: fork, 100k)",
            kind="startup",
            make_dataset=_paths_dataset,
            batch_size=32,
            num_workers=2,
            start_methods=("spawn",),
            quick_start_methods=("fork",),
            fixed_length=1_000_000,
        ),
        WorkloadSpec(
            name="epochs",
            summary="short epochs of tiny (10 batches), new workers each; fork and spawn "
            "(--quick: fork)",
            kind="epochs",
            make_dataset=lambda n, quick: TinyDataset(n),
            batch_size=256,
            num_workers=2,
            persistent_workers=False,
            warmup=1,
            min_batches=2,
            max_batches=500,
            quick_warmup=0,
            quick_batches=3,
            quick_seconds=0.2,
            start_methods=("fork", "spawn"),
            quick_start_methods=("fork",),
            fixed_length=10 * 256,
        ),
    )
}
