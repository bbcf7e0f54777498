"""A row of the benchmark's table: one workload in one configuration, every loader's runs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal

from conveyor_bench.machine import MachineCheck
from conveyor_bench.measure import Measurement

LOADERS = ("conveyor", "torch")
ALTERNATIVES = ("spdl", "grain")  # optional columns (conveyor_bench.alternatives)
PLAIN = "plain"
REFERENCE = "reference"
INLINE_CONFIG = "num_workers=0"  # the config of a workload's in-process row
NOT_INSTALLED = "not installed"

RowKind = Literal[
    "throughput",
    "startup",
    "epochs",
    "train",
    "baseline",
    "reference",
    "features",
    "variant",
    "memory",
]
TIMED_KINDS = ("startup", "epochs")  # rows whose figure is seconds: lower is better


@dataclass
class Row:
    """One line of the table: a workload in one configuration, every loader's runs.

    ``missing`` holds the loaders that would have joined the row but are not installed;
    ``loader_cpu_ms`` each loader's own CPU per batch (see ``notes.loader_cpu``);
    a plain-loop row keeps the workload's ``machine`` check.
    """

    workload: str
    config: str
    kind: RowKind
    runs: dict[str, list[Measurement]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    loader_cpu_ms: dict[str, float] = field(default_factory=dict)
    machine: MachineCheck | None = None

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

    def ratio(self, other: str = "torch") -> float | None:
        """conveyor's speedup over ``other`` (higher is better for conveyor)."""
        mine, theirs = self.median("conveyor"), self.median(other)
        if mine is None or theirs is None or mine <= 0 or theirs <= 0:
            return None
        return theirs / mine if self.timed else mine / theirs

    def per_batch(self, loader: str, figure: str) -> float | None:
        """The median over the rounds of a per-batch figure of ``Measurement`` (e.g.
        ``"main_cpu_ms_per_batch"``); None where no round has it."""
        values = [v for m in self.runs.get(loader, []) if (v := getattr(m, figure)) is not None]
        return statistics.median(values) if values else None
