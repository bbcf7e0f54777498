"""A bar chart of a benchmark report: ``conveyor bench --plot out.png``; needs matplotlib.

The left panel has samples/s per throughput workload (log scale): conveyor and torch (and
SPDL and Grain, where they ran) with workers, conveyor with ``num_workers=0``, and the
reference loop. The right one has the rows measured in seconds (start-up, short epochs):
conveyor and torch, lower is better.
Each bar is the median over the rounds; its whisker spans the slowest to the fastest round.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor_bench.rows import INLINE_CONFIG, REFERENCE, Row
from conveyor_bench.runner import BenchReport


class MatplotlibMissingError(ImportError):
    """A plot was asked for where matplotlib cannot be imported."""


@dataclass(frozen=True)
class Series:
    label: str
    color: str


WORKERS_CONVEYOR = Series("conveyor, workers", "#1f77b4")
WORKERS_TORCH = Series("torch, workers", "#ff7f0e")
WORKERS_SPDL = Series("spdl, workers", "#2ca02c")
WORKERS_GRAIN = Series("grain, workers", "#9467bd")
INLINE_CONVEYOR = Series("conveyor, num_workers=0", "#8fbbe0")
REFERENCE_LOOP = Series("reference loop", "#7f7f7f")


@dataclass(frozen=True)
class Bar:
    """One bar: the median over the rounds, and the slowest and fastest round."""

    series: Series
    median: float
    low: float
    high: float


@dataclass(frozen=True)
class Group:
    """The bars of one workload (or one timed row), side by side."""

    label: str
    bars: tuple[Bar, ...]


def require_matplotlib() -> Any:
    """``matplotlib.figure``, or a MatplotlibMissingError that says how to install it."""
    try:
        return importlib.import_module("matplotlib.figure")
    except ImportError as exc:
        raise MatplotlibMissingError(
            f"--plot needs matplotlib, which this Python ({sys.executable}) cannot import "
            f"({exc}). Install it with: pip install matplotlib"
        ) from exc


def _bar(row: Row | None, loader: str, series: Series) -> Bar | None:
    if row is None or (median := row.median(loader)) is None:
        return None
    values = row.values(loader)
    return Bar(series, median, min(values), max(values))


def _group(label: str, *bars: Bar | None) -> Group | None:
    present = tuple(bar for bar in bars if bar is not None)
    return Group(label, present) if present else None


def throughput_groups(report: BenchReport) -> list[Group]:
    """Per throughput workload, in the report's order: its bars in samples/s."""
    groups = []
    for workload in dict.fromkeys(row.workload for row in report.rows):
        rows = [row for row in report.rows if row.workload == workload]
        inline = next((r for r in rows if r.config == INLINE_CONFIG), None)
        workers = next(
            (r for r in rows if r.kind in ("throughput", "train") and r is not inline), None
        )
        reference = next((r for r in rows if r.kind == "reference"), None)
        group = _group(
            workload,
            _bar(workers, "conveyor", WORKERS_CONVEYOR),
            _bar(workers, "torch", WORKERS_TORCH),
            _bar(workers, "spdl", WORKERS_SPDL),
            _bar(workers, "grain", WORKERS_GRAIN),
            _bar(inline, "conveyor", INLINE_CONVEYOR),
            _bar(reference, REFERENCE, REFERENCE_LOOP),
        )
        if group is not None:
            groups.append(group)
    return groups


def timed_groups(report: BenchReport) -> list[Group]:
    """Per row measured in seconds (start-up, epochs): conveyor's and torch's bars."""
    groups = []
    for row in report.rows:
        if not row.timed:
            continue
        method = next((m for m in ("fork", "spawn", "forkserver") if m in row.config), "")
        group = _group(
            f"{row.workload}\n{method}".strip(),
            _bar(row, "conveyor", WORKERS_CONVEYOR),
            _bar(row, "torch", WORKERS_TORCH),
        )
        if group is not None:
            groups.append(group)
    return groups


def _short(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _draw(axes: Any, groups: list[Group], unit: str, legend: dict[str, Any]) -> None:
    """Draw ``groups`` on ``axes``; one handle per series goes into ``legend``."""
    width = 0.8 / max(len(group.bars) for group in groups)
    for position, group in enumerate(groups):
        start = position - width * (len(group.bars) - 1) / 2
        for offset, bar in enumerate(group.bars):
            # A whisker only where the rounds differ (not for a single round).
            spread = bar.high > bar.low
            errors = [[bar.median - bar.low], [bar.high - bar.median]] if spread else None
            bars = axes.bar(
                start + offset * width,
                bar.median,
                width,
                yerr=errors,
                capsize=2,
                color=bar.series.color,
            )
            legend.setdefault(bar.series.label, bars)
            axes.bar_label(bars, labels=[_short(bar.median, unit)], fontsize=7, padding=2)
    axes.set_xticks(range(len(groups)), [group.label for group in groups])
    axes.set_yscale("log")
    axes.margins(y=0.15)


def plot_report(report: BenchReport, path: str | Path) -> Path:
    """Draw ``report`` as a bar chart into ``path`` (its format from the suffix: .png,
    .svg, .pdf); return the path. Raises MatplotlibMissingError without matplotlib and
    ValueError when the report has no figure to draw."""
    panels = [
        (groups, unit, title)
        for groups, unit, title in (
            (throughput_groups(report), "samples/s", "samples/s, higher is better"),
            (timed_groups(report), "s", "seconds (first batch; an epoch), lower is better"),
        )
        if groups
    ]
    if not panels:
        raise ValueError("the report has no figure to plot: every loader failed or none ran")
    figure_module = require_matplotlib()
    widths = [max(len(groups), 1.5) for groups, _, _ in panels]
    figure = figure_module.Figure(figsize=(2.2 * sum(widths) + 1.5, 4.8), layout="constrained")
    all_axes = figure.subplots(1, len(panels), squeeze=False, width_ratios=widths)[0]
    legend: dict[str, Any] = {}
    for axes, (groups, unit, title) in zip(all_axes, panels, strict=True):
        _draw(axes, groups, unit, legend)
        axes.set_title(title, fontsize=10)
    figure.legend(
        list(legend.values()), list(legend), loc="outside lower center", ncols=3, fontsize=8
    )
    options = report.options
    rounds = f"median of {options.repeat} rounds" if options.repeat > 1 else "1 round"
    cores = report.environment.get("cores", "?")
    quick = ", --quick (a smoke test)" if options.quick else ""
    figure.suptitle(f"conveyor bench: {rounds}{quick}; cores: {cores}", fontsize=10)
    target = Path(path)
    figure.savefig(target, dpi=120)
    return target
