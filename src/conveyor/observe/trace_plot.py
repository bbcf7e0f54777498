"""``conveyor trace-plot run.json``: a trace (see trace.py) drawn as a PNG, one lane per
worker and one for the training loop, each stage in its own colour; needs matplotlib."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "plot_trace", "run"]

COLOURS = {
    "fetch": "#1f77b4",
    "collate": "#2ca02c",
    "send": "#9467bd",
    "wait": "#d62728",
    "decode": "#ff7f0e",
    "pin": "#8c564b",
}
OTHER = "#7f7f7f"


def plot_trace(trace: dict[str, Any], path: str | Path) -> Path:
    figure_module = _matplotlib()
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    lanes = sorted({(e["pid"], e["tid"]) for e in events}, key=lambda k: names.get(k, ""))
    if not events:
        raise ValueError("the trace holds no spans: was anything loaded while tracing?")
    start = min(e["ts"] for e in events)
    figure = figure_module.Figure(figsize=(12, 0.5 + 0.45 * len(lanes)))
    axes = figure.subplots()
    for row, lane in enumerate(lanes):
        mine = [e for e in events if (e["pid"], e["tid"]) == lane]
        for name in sorted({e["name"] for e in mine}):
            spans = [((e["ts"] - start) / 1e3, e["dur"] / 1e3) for e in mine if e["name"] == name]
            axes.broken_barh(spans, (row - 0.4, 0.8), color=COLOURS.get(name, OTHER), label=name)
    axes.set_yticks(range(len(lanes)), [names.get(lane, str(lane)) for lane in lanes])
    axes.set_xlabel("milliseconds")
    axes.invert_yaxis()
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes.legend(unique.values(), unique.keys(), loc="upper right", ncols=len(unique))
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, dpi=120)
    return target


def _matplotlib() -> Any:
    try:
        return importlib.import_module("matplotlib.figure")
    except ImportError as exc:
        raise ImportError(
            f"trace-plot needs matplotlib, which this Python ({sys.executable}) cannot import "
            f"({exc}). Install it with: pip install matplotlib"
        ) from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="a trace written by loader.trace(PATH)")
    parser.add_argument("-o", "--output", help="the PNG to write (default: TRACE with .png)")


def run(args: argparse.Namespace) -> int:
    source = Path(args.trace)
    try:
        trace = json.loads(source.read_text())
        written = plot_trace(trace, args.output or source.with_suffix(".png"))
    except (OSError, ValueError, KeyError, ImportError) as exc:
        print(f"conveyor trace-plot: {exc}", file=sys.stderr)
        return 2
    print(written)
    return 0
