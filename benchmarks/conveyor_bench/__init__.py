"""Benchmark: conveyor's DataLoader against torch's on the same workloads, in one process.

Run it with ``conveyor bench`` or ``python benchmarks/run.py``; see ``benchmarks/README.md``.
"""

from conveyor_bench.catalogue import WORKLOADS
from conveyor_bench.measure import Measurement
from conveyor_bench.plot import MatplotlibMissingError, plot_report
from conveyor_bench.report import render, to_json
from conveyor_bench.runner import BenchOptions, BenchReport, Row, run_benchmark
from conveyor_bench.specs import WorkloadSpec

__all__ = [
    "WORKLOADS",
    "BenchOptions",
    "BenchReport",
    "MatplotlibMissingError",
    "Measurement",
    "Row",
    "WorkloadSpec",
    "plot_report",
    "render",
    "run_benchmark",
    "to_json",
]
