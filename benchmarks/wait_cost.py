"""Where the main process's CPU per batch goes: ``python benchmarks/wait_cost.py``.

The ``image`` and ``tiny`` workloads (2 fork workers, persistent) through conveyor and
through the reference loop, each run twice: as fast as it goes, and with the consumer
spinning after each batch (``--spin-us``) so that the next batch is always ready when it
is asked for. The main thread's CPU a batch, the spin excluded, is then the hand-out
path alone in the second run, and the hand-out path plus the waits (sleeping on the
workers' pipes, waking) in the first. Alternating rounds, medians; prints one Markdown
table (issue 40: the hand-out path was within 1.11x the reference loop's on image, the
waits made it 1.45x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from conveyor import DataLoader
from conveyor_bench.measurement import touch
from conveyor_bench.reference import SharedMemoryLoop
from conveyor_bench.workloads import ImageDataset, TinyDataset

WORKLOADS: dict[str, tuple[Callable[[int], Any], int, float]] = {
    # name: (dataset of n samples, batch size, spin in us: well past a batch's worker time)
    "image": (ImageDataset, 64, 2000.0),
    "tiny": (TinyDataset, 256, 1000.0),
}
WARMUP = 300


def main_cpu_per_batch(loader: Iterable[Any], batches: int, spin_s: float) -> float:
    """The main thread's CPU seconds a batch over ``batches``, the consumer's spin left out."""
    it = iter(loader)
    try:
        for _ in range(WARMUP):
            touch(next(it))
        spun = 0.0
        start = time.thread_time()
        for _ in range(batches):
            touch(next(it))
            if spin_s:
                began, until = time.thread_time(), time.perf_counter() + spin_s
                while time.perf_counter() < until:
                    pass
                spun += time.thread_time() - began
        return (time.thread_time() - start - spun) / batches
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _loader(kind: str, dataset: Any, batch_size: int) -> Iterable[Any]:
    if kind == "reference":
        return SharedMemoryLoop(dataset, batch_size, num_workers=2)
    return DataLoader(
        dataset, batch_size=batch_size, num_workers=2, persistent_workers=True,
        multiprocessing_context="fork",
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="image,tiny")
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch: Any = sys.modules.get("torch")  # (conveyor loads it where it is installed)
    if torch is not None:  # as the benchmark does: its threads would compete with the workers
        torch.set_num_threads(1)
    print("| workload | loader | main CPU a batch, free running | with the batch always ready |")
    print("|---|---|---|---|")
    for name in args.workloads.split(","):
        make, batch_size, spin_us = WORKLOADS[name]
        dataset = make(batch_size * (WARMUP + args.batches + 100))
        runs: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.repeat):
            for kind in ("conveyor", "reference"):
                for ready in (False, True):
                    spin = spin_us / 1e6 if ready else 0.0
                    loader = _loader(kind, dataset, batch_size)
                    cpu = main_cpu_per_batch(loader, args.batches, spin)
                    runs.setdefault((kind, ready), []).append(cpu)
        med = {key: statistics.median(values) * 1e6 for key, values in runs.items()}
        for kind in ("conveyor", "reference"):
            free, ready = med[(kind, False)], med[(kind, True)]
            if kind == "conveyor":
                free_ratio = free / med[("reference", False)]
                ready_ratio = ready / med[("reference", True)]
                cells = f"{free:.0f} us ({free_ratio:.2f}x) | {ready:.0f} us ({ready_ratio:.2f}x)"
            else:
                cells = f"{free:.0f} us | {ready:.0f} us"
            print(f"| {name} | {kind} | {cells} |")


if __name__ == "__main__":
    main()
