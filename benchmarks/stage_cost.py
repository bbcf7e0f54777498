"""What always-on stage timings cost: ``python benchmarks/stage_cost.py [--repeat K]``.

The ``tiny`` and ``image`` workloads (2 fork workers, persistent) through conveyor as it
is, and through conveyor with the main process's side of the timings switched off (the
tally's per-batch calls made no-ops, in this process only; forked workers inherit it,
their own two clock reads a batch stay). Alternating rounds, medians; prints one
Markdown table: samples/s with and without, and the cost as a share.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Iterator
from typing import Any

from conveyor import DataLoader
from conveyor._iter import tally
from conveyor.observe import timings
from conveyor_bench.measure import WindowSpec, measure_throughput
from conveyor_bench.workloads import ImageDataset, TinyDataset


@contextlib.contextmanager
def timings_off() -> Iterator[None]:
    """The per-batch calls of the tally and the stage clock, as no-ops."""
    saved = {
        (tally.Tally, "worked"): tally.Tally.worked,
        (tally.Tally, "waited"): tally.Tally.waited,
        (tally.Tally, "main_work"): tally.Tally.main_work,
        (timings.StageClock, "handed_out"): timings.StageClock.handed_out,
    }
    tally.Tally.worked = lambda *a, **k: None  # type: ignore[method-assign]
    tally.Tally.waited = lambda *a, **k: None  # type: ignore[method-assign]
    tally.Tally.main_work = lambda *a, **k: 0.0  # type: ignore[method-assign]
    timings.StageClock.handed_out = lambda *a, **k: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for (owner, name), method in saved.items():
            setattr(owner, name, method)


def _rate(dataset: Any, batch_size: int, window: WindowSpec, off: bool) -> float:
    def make() -> DataLoader:
        return DataLoader(
            dataset, batch_size=batch_size, num_workers=2, persistent_workers=True,
            multiprocessing_context="fork",
        )  # fmt: skip

    context = timings_off() if off else contextlib.nullcontext()
    with context:
        return measure_throughput(make, window).samples_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print("| workload | timings on, samples/s | off | cost |")
    print("|---|---|---|---|")
    for name, dataset, batch, batches in (
        ("tiny", TinyDataset(256 * 40_000), 256, 40_000),
        ("image", ImageDataset(64 * 20_000), 64, 20_000),
    ):
        window = WindowSpec(
            warmup=20, min_batches=20, max_batches=batches - 40, seconds=args.seconds
        )
        on: list[float] = []
        off: list[float] = []
        for round_ in range(args.repeat):
            for timing_off in (round_ % 2 == 1, round_ % 2 == 0):  # alternate who goes first
                (off if timing_off else on).append(_rate(dataset, batch, window, timing_off))
        with_, without = statistics.median(on), statistics.median(off)
        print(f"| {name} | {with_:,.0f} | {without:,.0f} | {1 - with_ / without:+.1%} |")


if __name__ == "__main__":
    main()
