"""Render a benchmark report: a Markdown summary table, a details table, and raw JSON."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor_bench.rows import ALTERNATIVES, LOADERS, PLAIN, REFERENCE, Row
from conveyor_bench.runner import BenchReport

DASH = "-"
UNITS = {"startup": "seconds", "epochs": "seconds per epoch"}
DETAILS_HEADER = (
    "workload",
    "config",
    "loader",
    "median",
    "min - max",
    "main CPU ms/batch",
    "workers CPU ms/batch",
    "loader's own CPU ms/batch",
    "main faults/batch",
    "workers faults/batch",
    "peak RSS MB",
    "runs",
)


def _table(header: tuple[str, ...], body: Sequence[tuple[str, ...]]) -> str:
    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"

    rule = "|" + "|".join("---" for _ in header) + "|"
    return "\n".join([line(header), rule, *(line(cells) for cells in body)])


def _value(row: Row, value: float | None) -> str:
    if value is None:
        return DASH
    if row.kind == "startup":
        return f"{value:.2f} s"
    if row.kind == "epochs":
        return f"{1000 * value:,.0f} ms"
    return f"{value:,.0f}"


def with_spread(row: Row, loader: str) -> str:
    """The median and, over two rounds or more, how far the farthest round is from it."""
    median = _value(row, row.median(loader))
    spread = row.spread(loader)
    return median if spread is None else f"{median} ±{spread:.0%}"


def _cell(row: Row, loader: str) -> str:
    if row.kind in ("baseline", "reference") or (row.kind == "features" and loader != "conveyor"):
        return DASH
    if loader in row.errors:
        return "error"
    if loader in row.missing:
        return row.missing[loader]
    return with_spread(row, loader)


def columns(report: BenchReport) -> tuple[str, ...]:
    """The summary's loader columns: conveyor, torch, and each alternative that joined a
    row (ran, failed, or is not installed)."""
    joined = {name for row in report.rows for name in (*row.runs, *row.errors, *row.missing)}
    return (*LOADERS, *(name for name in ALTERNATIVES if name in joined))


def summary_table(report: BenchReport) -> str:
    loaders = columns(report)
    header = ("workload", "config", *(f"{name} samples/s" for name in loaders), "ratio", "notes")
    body = []
    for row in report.rows:
        ratio = row.ratio()
        body.append(
            (
                row.workload,
                row.config,
                *(_cell(row, name) for name in loaders),
                DASH if ratio is None else f"{ratio:.2f}x",
                "; ".join(row.notes),
            )
        )
    return _table(header, body)


def _figure(value: float | None, digits: int = 2) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def details_table(report: BenchReport) -> str:
    body = []
    for row in report.rows:
        for loader in (*LOADERS, *ALTERNATIVES, PLAIN, REFERENCE):
            runs = row.runs.get(loader)
            if not runs:
                continue
            values = row.values(loader)
            rss = [m.peak_rss_bytes for m in runs if m.peak_rss_bytes is not None]
            workers = row.per_batch(loader, "workers_cpu_ms_per_batch")
            body.append(
                (
                    row.workload,
                    row.config,
                    loader,
                    _value(row, row.median(loader)),
                    f"{_value(row, min(values))} - {_value(row, max(values))}",
                    _figure(row.per_batch(loader, "main_cpu_ms_per_batch")),
                    _figure(workers if any(m.worker_processes for m in runs) else None),
                    _figure(row.loader_cpu_ms.get(loader)),
                    _figure(row.per_batch(loader, "main_faults_per_batch"), 0),
                    _figure(row.per_batch(loader, "workers_faults_per_batch"), 0),
                    f"{max(rss) / 2**20:,.0f}" if rss else DASH,
                    str(len(runs)),
                )
            )
    return _table(DETAILS_HEADER, body)


CPU_HEADER = (
    "workload",
    "config",
    "loader",
    "main CPU ms/batch",
    "workers CPU ms/batch",
    "main / reference's",
    "workers / reference's",
    "all / reference's",
    "main calls/batch: Python, all",
)
_CPU_KINDS = ("throughput", "features", "variant", "baseline", "reference")


def cpu_table(report: BenchReport) -> str:
    """CPU per batch of every loader row, the main process's and the workers' apart, and
    each over the reference loop's (where the workload has one): what a batch costs, far
    steadier on a shared machine than samples/s."""
    references = {row.workload: row for row in report.rows if row.kind == "reference"}
    body = []
    for row in report.rows:
        if row.kind not in _CPU_KINDS:
            continue
        reference = references.get(row.workload)
        theirs = _cpu(reference, REFERENCE) if reference is not None else (None, None)
        total = theirs[0] + theirs[1] if theirs[0] and theirs[1] else None
        for loader in (*LOADERS, *ALTERNATIVES, PLAIN, REFERENCE):
            if not row.runs.get(loader) or loader in row.errors:
                continue
            main, workers = _cpu(row, loader)
            every = None if main is None else main + (workers or 0.0)
            body.append(
                (
                    row.workload,
                    row.config,
                    loader,
                    _figure(main),
                    _figure(workers),
                    _over(main, theirs[0]),
                    _over(workers, theirs[1]),
                    _over(every, total),
                    _calls(row, loader),
                )
            )
    return _table(CPU_HEADER, body)


def _calls(row: Row, loader: str) -> str:
    python, every = row.per_batch(loader, "main_python_calls"), row.per_batch(loader, "main_calls")
    return DASH if python is None or every is None else f"{python:,.0f}, {every:,.0f}"


def _cpu(row: Row, loader: str) -> tuple[float | None, float | None]:
    """A loader's main-process and workers' CPU ms per batch (workers: None without any
    worker process)."""
    runs = row.runs.get(loader, [])
    workers = row.per_batch(loader, "workers_cpu_ms_per_batch")
    has_workers = any(m.worker_processes for m in runs)
    return row.per_batch(loader, "main_cpu_ms_per_batch"), workers if has_workers else None


def _over(value: float | None, base: float | None) -> str:
    return DASH if value is None or not base else f"{value / base:.2f}x"


def machine_checks(report: BenchReport) -> str:
    """One line per machine check: the plain loop in N bare processes against one."""
    lines = []
    for row in report.rows:
        if (check := row.machine) is None:
            continue
        side = _figure(check.parallel_cpu_ms_per_batch)
        lines.append(
            f"- {row.workload}: {check.processes} bare processes ran {check.speedup:.2f}x "
            f"one; CPU per batch {check.single_cpu_ms_per_batch:,.2f} ms alone, {side} ms "
            f"side by side ({check.batches} batches a process)"
        )
    return "\n".join(lines)


def render(report: BenchReport) -> str:
    """The whole report as Markdown: environment header, summary, details, how to read it."""
    options = report.options
    header = [f"- {key}: {value}" for key, value in report.environment.items()]
    rounds = (
        f"{options.repeat} alternating rounds, median shown, ±: the farthest round from it"
        if options.repeat > 1
        else "1 round (no spread: use --repeat 3 or more to see one)"
    )
    header.append(
        f"- runs: {rounds}; quick={options.quick}, "
        f"start method={options.start_method or 'loader default'}"
    )
    return "\n\n".join(
        [
            "# conveyor benchmark",
            "\n".join(header),
            summary_table(report),
            "ratio: conveyor's speedup over torch (samples/s conveyor / torch; for startup "
            "and epochs torch seconds / conveyor seconds). Above 1 means conveyor is faster. "
            "±x%: every round was within x% of the median shown.",
            "## CPU per batch",
            cpu_table(report),
            "main CPU: the main process's CPU time per timed batch (all its threads); workers "
            "CPU: its worker processes' (see Details). The ratios divide by the reference "
            "loop's figure of the same workload (all: main + workers): the least a "
            "shared-memory loader spends there, so 1.00x is the floor, not a cap. CPU per "
            "batch varies far less than samples/s from one run to the next on a shared "
            "machine. main calls/batch: the function calls the main process makes per batch "
            "(Python functions; all, C ones too), counted over a few batches before the "
            "window (benchmarks/conveyor_bench/calls.py): a count, the same on a busy "
            "machine.",
            "## Details",
            details_table(report),
            "main CPU: the main process's CPU time per timed batch (all its threads). "
            "workers CPU: the CPU time of its descendants (the workers; under forkserver the "
            "fork server's children; multiprocessing's helpers left out), read from /proc "
            "(the time their threads ran, schedstat, in ns) when the window starts and ends, "
            "per batch. loader's own CPU: main + workers CPU "
            "less the plain loop's CPU per batch for the same work (for rows with workers, "
            "the machine check's: the plain loop in as many bare processes side by side), so "
            "it holds collate where the loader collates by default and any slowdown the "
            "work suffers from sharing cores with the loader's own processes; noisy, "
            "can be below 0. faults: minor page faults per batch (fresh memory touched). "
            "peak RSS: the largest sum of RSS over the main process and its descendants, "
            "sampled when the window starts and at each quarter of it; pages shared "
            "between processes count once per process.",
            *(["## Machine checks", checks] if (checks := machine_checks(report)) else []),
        ]
    )


def to_json(report: BenchReport) -> dict[str, Any]:
    rows = []
    for row in report.rows:
        results = {
            loader: {
                "median": row.median(loader),
                "unit": UNITS.get(row.kind, "samples/s"),
                "spread": row.spread(loader),
                "runs": [
                    {
                        **dataclasses.asdict(m),
                        "samples_per_s": m.samples_per_s,
                        "main_cpu_ms_per_batch": m.main_cpu_ms_per_batch,
                        "main_faults_per_batch": m.main_faults_per_batch,
                        "workers_cpu_ms_per_batch": m.workers_cpu_ms_per_batch,
                        "workers_faults_per_batch": m.workers_faults_per_batch,
                    }
                    for m in runs
                ],
                "loader_cpu_ms_per_batch": row.loader_cpu_ms.get(loader),
            }
            for loader, runs in row.runs.items()
        }
        rows.append(
            {
                "workload": row.workload,
                "config": row.config,
                "kind": row.kind,
                "ratio": row.ratio(),
                "conveyor_vs": {
                    name: ratio
                    for name in ("torch", *ALTERNATIVES)
                    if (ratio := row.ratio(name)) is not None
                },
                "notes": row.notes,
                "errors": row.errors,
                "missing": row.missing,
                "machine_check": None if row.machine is None else dataclasses.asdict(row.machine),
                "results": results,
            }
        )
    return {
        "environment": report.environment,
        "options": dataclasses.asdict(report.options),
        "rows": rows,
    }


def write_json(report: BenchReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(report), indent=2) + "\n", encoding="utf-8")
