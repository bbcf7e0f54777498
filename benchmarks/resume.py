"""What checkpointing and reseeding cost: ``python benchmarks/resume.py [--quick] [--repeat K]``.

Prints two Markdown tables (see benchmarks/README.md):

* ``state_dict()`` mid-way through a 1M-sample epoch: its time, its size as JSON, and
  the time from ``load_state_dict`` to the first batch of the resumed loader.
* Throughput of the ``tiny`` and ``image`` workloads with ``reseed="batch"`` and
  ``"sample"``, and with a dataset that has a ``state_dict`` of its own (each worker
  then sends its state with every batch: ``snapshot_every_n_steps=1``, the default)
  against ``snapshot_every_n_steps=0``; torch's loader as the reference column.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from conveyor import DataLoader
from conveyor_bench.measure import WindowSpec, measure_throughput, touch
from conveyor_bench.workloads import ImageDataset, TinyDataset


class StatefulTiny(TinyDataset):
    """The tiny workload with a state of its own (a counter, as a resumable dataset has)."""

    def state_dict(self) -> dict[str, int]:
        return {"length": len(self)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


def _median_s(call: Callable[[], Any], times: int) -> float:
    runs = []
    for _ in range(times):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def state_table(samples: int, workers: int) -> list[str]:
    """state_dict() half-way through an epoch of ``samples`` samples, shuffled."""
    generator = torch.Generator()
    generator.manual_seed(0)
    dataset = TinyDataset(samples)
    options: dict[str, Any] = dict(batch_size=256, shuffle=True, generator=generator)
    if workers:
        options.update(num_workers=workers, multiprocessing_context="fork")
    loader = DataLoader(dataset, **options)
    it = iter(loader)
    for _ in range(len(loader) // 2):
        next(it)
    took = _median_s(loader.state_dict, 21)
    text = json.dumps(loader.state_dict())
    del it
    resumed = DataLoader(dataset, **options)
    t0 = time.perf_counter()
    resumed.load_state_dict(json.loads(text))
    touch(next(iter(resumed)))
    first = time.perf_counter() - t0
    return [
        f"| {samples:,} samples, {workers} workers | {took * 1e6:,.0f} µs | "
        f"{len(text):,} bytes | {first * 1e3:,.0f} ms |"
    ]


def _rates(
    variants: dict[str, Callable[[], Any]], window: WindowSpec, repeat: int
) -> dict[str, float]:
    """Each variant's median samples/s; rounds alternate which variant goes first, so
    a slow spell of a shared machine does not land on one variant only."""
    runs: dict[str, list[float]] = {label: [] for label in variants}
    labels = list(variants)
    for round_ in range(repeat):
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            runs[label].append(measure_throughput(variants[label], window).samples_per_s)
    return {label: statistics.median(values) for label, values in runs.items()}


def throughput_table(quick: bool, repeat: int) -> list[str]:
    rows = []
    cases = [
        ("tiny", TinyDataset, 256, 40 if quick else 4000),
        ("image", ImageDataset, 64, 10 if quick else 600),
    ]
    for name, kind, batch, batches in cases:
        window = WindowSpec(5, batches, batches, 0.0 if quick else 2.0)
        dataset = kind((batches + 10) * batch)
        stateful = StatefulTiny((batches + 10) * batch) if name == "tiny" else None
        for workers in (2, 0):
            extra: dict[str, Any] = {}
            if workers:
                extra = dict(num_workers=workers, persistent_workers=True)

            def make(cls: Any = DataLoader, data: Any = dataset, **kw: Any) -> Callable[[], Any]:
                return functools.partial(cls, data, batch_size=batch, **extra, **kw)  # noqa: B023

            variants = {
                "torch": make(torch.utils.data.DataLoader),
                "conveyor": make(),
                'reseed="batch"': make(reseed="batch"),
                'reseed="sample"': make(reseed="sample"),
            }
            if stateful is not None and workers:
                variants["own state, snapshot every 1"] = make(data=stateful)
                variants["own state, snapshot every 0"] = make(
                    data=stateful, snapshot_every_n_steps=0
                )
            rates = _rates(variants, window, repeat)
            base = rates["conveyor"]
            for label, value in rates.items():
                rows.append(
                    f"| {name} | {workers} workers | {label} | {value:,.0f} | {value / base:.2f} |"
                )
            print(f"  {name}, {workers} workers done", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few batches: a smoke test")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median shown)")
    args = parser.parse_args(argv)
    samples = 20_000 if args.quick else 1_000_000
    print("| epoch | state_dict() | JSON size | load → first batch |")
    print("|---|---|---|---|")
    for workers in (0, 2):
        print("\n".join(state_table(samples, workers)))
    print()
    print("| workload | loader | variant | samples/s | vs conveyor default |")
    print("|---|---|---|---|---|")
    print("\n".join(throughput_table(args.quick, args.repeat)))
    return 0


if __name__ == "__main__":  # guard: spawned workers re-import this file as __mp_main__
    raise SystemExit(main())
