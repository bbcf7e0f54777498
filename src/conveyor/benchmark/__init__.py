"""Benchmark: conveyor's DataLoader against torch's on the same workloads, in one process.

Run it with ``conveyor bench`` or ``python benchmarks/run.py``; see ``benchmarks/README.md``.
"""

from conveyor.benchmark.measure import Measurement
from conveyor.benchmark.plot import MatplotlibMissingError, plot_report
from conveyor.benchmark.report import render, to_json
from conveyor.benchmark.runner import BenchOptions, BenchReport, Row, run_benchmark
from conveyor.benchmark.specs import WORKLOADS, WorkloadSpec

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
