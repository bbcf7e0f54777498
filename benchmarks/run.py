"""Run the conveyor benchmark: ``python benchmarks/run.py [--workloads tiny,image] [--quick]``.

The same as ``conveyor bench``; see benchmarks/README.md.
"""

from conveyor_bench.command import main

if __name__ == "__main__":  # guard: spawned workers re-import this file as __mp_main__
    raise SystemExit(main())
