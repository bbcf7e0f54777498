"""Run the workloads with conveyor and torch side by side and collect the results.

Each table row is one loader configuration; each repeat (a round) runs every loader once,
alternating which goes first, so slow drift on a noisy machine hits both alike. A figure is
the median over the rounds, shown with its spread. A failing loader is recorded on its row
and the benchmark goes on. What to run: :mod:`.options`; the loaders: :mod:`.loaders`; a
row's rounds: :mod:`.rounds`; a workload's rows: :mod:`.workload`.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, TextIO

from conveyor_bench import alternatives
from conveyor_bench.catalogue import WORKLOADS
from conveyor_bench.loaders import describe_environment, resolve_loaders
from conveyor_bench.options import ALL_LOADERS, QUICK_LOADERS, BenchOptions, BenchReport
from conveyor_bench.rounds import Progress
from conveyor_bench.rows import (
    ALTERNATIVES,
    INLINE_CONFIG,
    LOADERS,
    PLAIN,
    REFERENCE,
    TIMED_KINDS,
    Row,
    RowKind,
)
from conveyor_bench.workload import FEATURES, run_workload

__all__ = [
    "ALL_LOADERS",
    "ALTERNATIVES",
    "FEATURES",
    "INLINE_CONFIG",
    "LOADERS",
    "PLAIN",
    "QUICK_LOADERS",
    "REFERENCE",
    "TIMED_KINDS",
    "BenchOptions",
    "BenchReport",
    "Row",
    "RowKind",
    "alternatives",
    "run_benchmark",
]

_TORCH_WORKER_WARNING = r"This DataLoader will create \d+ worker processes in total"


def run_benchmark(options: BenchOptions, progress: TextIO | None = sys.stderr) -> BenchReport:
    """Run every workload in ``options``; progress lines go to ``progress`` (None: silent)."""
    loaders = resolve_loaders(options)
    if not any(name in loaders.classes for name in LOADERS):
        raise RuntimeError(
            "neither conveyor.DataLoader nor torch.utils.data.DataLoader can be imported: "
            + "; ".join(f"{k}: {loaders.descriptions[k]}" for k in LOADERS)
        )
    torch: Any = sys.modules.get("torch")
    previous_threads = torch.get_num_threads() if torch else None
    if torch:  # intra-op threads in the main process would compete with the workers' cores
        torch.set_num_threads(1)
    try:
        environment = describe_environment(
            loaders, f"1 (was {previous_threads})" if torch else "n/a (torch not imported)"
        )
        say = Progress(progress)
        rows: list[Row] = []
        with warnings.catch_warnings():
            # torch warns when num_workers > cores; the latency workload asks for that.
            warnings.filterwarnings("ignore", _TORCH_WORKER_WARNING, UserWarning)
            for name in options.workloads:
                rows.extend(run_workload(WORKLOADS[name], options, loaders, say))
    finally:
        if torch and previous_threads:
            torch.set_num_threads(previous_threads)
    return BenchReport(environment, options, rows)
