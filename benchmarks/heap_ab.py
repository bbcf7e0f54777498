"""Before and after the workers keep their heap (issue 24): ``python benchmarks/heap_ab.py
off|on WORKLOADS``. ``off`` leaves glibc's malloc thresholds as they are (the behaviour
from 6fe3a4a until the fix), ``on`` is conveyor as it is. Fork workers, 3 rounds, conveyor
and torch. Run it in a fresh process each time: forked workers inherit the parent's
malloc state, so workloads run before it in the same process change the result."""
import sys
from conveyor.benchmark import BenchOptions, render, run_benchmark
import conveyor._workers.heap as heap

mode = sys.argv[1]
if mode == "off":
    heap._find_mallopt = lambda: None
opts = BenchOptions(workloads=tuple(sys.argv[2].split(",")), repeat=3, start_method="fork",
                    loaders=("conveyor", "torch"))
print(f"## heap keeper {mode}")
print(render(run_benchmark(opts, progress=None)))
