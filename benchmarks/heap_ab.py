"""Before and after the workers keep their heap (issue 24): ``python benchmarks/heap_ab.py
off|on WORKLOADS``. ``off`` leaves glibc's malloc thresholds as they are (the behaviour
from 6fe3a4a until the fix), ``on`` is conveyor as it is. Fork workers, 3 rounds, conveyor
and torch. Run it in a fresh process each time: forked workers inherit the parent's
malloc state, so workloads run before it in the same process change the result."""

from __future__ import annotations

import sys

import conveyor._workers.heap as heap
from conveyor_bench import BenchOptions, render, run_benchmark


def no_mallopt() -> None:
    return None  # as on a C library without mallopt: the thresholds stay glibc's


def main(mode: str, workloads: str) -> None:
    if mode == "off":
        heap._find_mallopt = no_mallopt  # forked workers inherit it
    options = BenchOptions(
        workloads=tuple(workloads.split(",")),
        repeat=3,
        start_method="fork",
        loaders=("conveyor", "torch"),
    )
    print(f"## heap keeper {mode}")
    print(render(run_benchmark(options, progress=None)))


if __name__ == "__main__":
    main(*sys.argv[1:3])
