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
            "## Details",
            details_table(report),
            "main CPU: the main process's CPU time per timed batch (all its threads). "
            "workers CPU: the CPU time of its descendants (the workers; under forkserver the "
            "fork server's children; multiprocessing's helpers left out), read from /proc "
            "when the window starts and ends, per batch. loader's own CPU: main + workers CPU "
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
