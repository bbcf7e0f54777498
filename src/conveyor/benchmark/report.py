"""Render a benchmark report: a Markdown summary table, a details table, and raw JSON."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor.benchmark.runner import LOADERS, PLAIN, REFERENCE, BenchReport, Row

DASH = "-"
UNITS = {"startup": "seconds", "epochs": "seconds per epoch"}
SUMMARY_HEADER = ("workload", "config", "conveyor samples/s", "torch samples/s", "ratio", "notes")
DETAILS_HEADER = (
    "workload",
    "config",
    "loader",
    "median",
    "min - max",
    "main CPU ms/batch",
    "main faults/batch",
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
    return with_spread(row, loader)


def summary_table(report: BenchReport) -> str:
    body = []
    for row in report.rows:
        ratio = row.ratio()
        body.append(
            (
                row.workload,
                row.config,
                _cell(row, "conveyor"),
                _cell(row, "torch"),
                DASH if ratio is None else f"{ratio:.2f}x",
                "; ".join(row.notes),
            )
        )
    return _table(SUMMARY_HEADER, body)


def details_table(report: BenchReport) -> str:
    body = []
    for row in report.rows:
        for loader in (*LOADERS, PLAIN, REFERENCE):
            runs = row.runs.get(loader)
            if not runs:
                continue
            values = row.values(loader)
            rss = [m.peak_rss_bytes for m in runs if m.peak_rss_bytes is not None]
            cpu = statistics.median(m.main_cpu_ms_per_batch for m in runs)
            faults = [f for m in runs if (f := m.main_faults_per_batch) is not None]
            body.append(
                (
                    row.workload,
                    row.config,
                    loader,
                    _value(row, row.median(loader)),
                    f"{_value(row, min(values))} - {_value(row, max(values))}",
                    f"{cpu:.2f}",
                    f"{statistics.median(faults):,.0f}" if faults else DASH,
                    f"{max(rss) / 2**20:,.0f}" if rss else DASH,
                    str(len(runs)),
                )
            )
    return _table(DETAILS_HEADER, body)


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
            "main faults: its minor page faults per batch (fresh memory being touched). "
            "peak RSS: the largest sum of RSS over the main process and its children among a "
            "few samples; pages shared between processes count once per process.",
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
                    }
                    for m in runs
                ],
            }
            for loader, runs in row.runs.items()
        }
        rows.append(
            {
                "workload": row.workload,
                "config": row.config,
                "kind": row.kind,
                "ratio": row.ratio(),
                "notes": row.notes,
                "errors": row.errors,
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
