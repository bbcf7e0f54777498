"""The terminal report: plain text, no colours, at most :data:`WIDTH` columns."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Sequence

from conveyor.dataset import is_iterable_dataset
from conveyor.diagnostics.findings import Report
from conveyor.doctor.profile import Profile
from conveyor.doctor.target import Target
from conveyor.doctor.units import fmt_bytes, fmt_seconds, plural

__all__ = ["WIDTH", "render"]

WIDTH = 100


def render(target: Target, profile: Profile, report: Report, advice: Sequence[str]) -> str:
    """The plain-text report: no colours, at most :data:`WIDTH` columns."""
    dataset, kind = target.dataset, type(target.dataset)
    size = ""
    with contextlib.suppress(Exception):
        size = f", {len(dataset):,} samples"
    style = "iterable-style" if is_iterable_dataset(dataset) else "map-style"
    collate = getattr(target.collate_fn, "__qualname__", None) or "default_collate"
    out = [f"conveyor doctor {target.spec}", ""]
    out += _facts(
        [
            ("dataset", f"{kind.__module__}.{kind.__qualname__} ({style}{size})"),
            ("loader", f"batch_size={profile.batch_size}, collate_fn={collate}"),
            ("workers", f"start method {profile.start_method}, {profile.cpus} CPUs usable"),
        ],
        width=8,
    )
    out += ["", "Pre-flight checks", *(f"  {line}".rstrip() for line in str(report).splitlines())]
    out += ["", "Measurements", *_measurements(profile)]
    out += ["", f"  {'workers':>7}  {'first batch':>11}  {'samples/s':>11}  {'batches':>7}"]
    out += _runs(profile)
    out += ["", "What to change"]
    out += [line for item in advice for line in _wrap(item, "  - ", "    ")] or ["  nothing"]
    errors, warned = len(report.errors) + profile.errors, len(report.warnings)
    status = 1 if errors else 0
    out += ["", f"{plural(errors, 'error')}, {plural(warned, 'warning')}: exit status {status}"]
    return "\n".join(out)


def _measurements(profile: Profile) -> list[str]:
    """Per-sample fetch time and one batch's size, then what failed in-process."""
    fetch = batch = "not measured"
    if profile.fetch_median_s is not None and profile.fetch_p95_s is not None:
        fetch = (
            f"median {fmt_seconds(profile.fetch_median_s)}, p95 "
            f"{fmt_seconds(profile.fetch_p95_s)} ({profile.fetch_count} samples, in-process)"
        )
    if profile.batch_parts is not None:
        arrays, other = profile.batch_parts
        batch = f"{fmt_bytes(arrays + other)} (arrays {fmt_bytes(arrays)}, other data pickled "
        batch += f"{fmt_bytes(other)})"
    elif any(r.error for r in profile.runs):
        batch = "not measured: no batch loaded"
    out = _facts([("per-sample fetch", fetch), ("one batch", batch)], width=16)
    return out + [line for problem in profile.problems for line in _wrap(problem, "  !  ", "     ")]


def _runs(profile: Profile) -> list[str]:
    """The table's rows, one a worker count, each followed by its notes."""
    out: list[str] = []
    shown: dict[str, int] = {}  # error -> the first worker count that had it
    for run in profile.runs:
        first = fmt_seconds(run.first_batch_s) if run.first_batch_s is not None else "-"
        rate = f"{run.samples_per_s:,.0f}" if run.samples_per_s else "-"
        mark = "  fastest" if run is profile.fastest else ""
        out.append(f"  {run.num_workers:>7}  {first:>11}  {rate:>11}  {run.batches:>7}{mark}")
        notes = []
        if run.error in shown:
            notes.append(f"failed: the same error as num_workers={shown[run.error]}")
        elif run.error:
            notes.append(f"failed: {run.error}")
            shown[run.error] = run.num_workers
        notes += [f"not started: the pre-flight found [{run.refused}]"] if run.refused else []
        notes += [f"warning: {w.splitlines()[0]}" for w in run.warnings]
        out += [line for note in notes for line in _wrap(note, " " * 11, " " * 13)]
    return out


def _wrap(text: str, first: str, indent: str) -> list[str]:
    """``text`` wrapped at :data:`WIDTH`, each of its lines on its own."""
    lines: list[str] = []
    for i, paragraph in enumerate(text.splitlines() or [""]):
        start = first if i == 0 else indent
        wrapped = textwrap.wrap(paragraph, WIDTH, initial_indent=start, subsequent_indent=indent)
        lines += wrapped or [start.rstrip()]
    return lines


def _facts(pairs: Sequence[tuple[str, str]], width: int) -> list[str]:
    """``key   value`` lines, the values aligned and wrapped."""
    pad = " " * (width + 4)
    return [line for key, value in pairs for line in _wrap(value, f"  {key:<{width}}  ", pad)]
