"""Soak test: one epoch while workers are SIGKILLed at random, against one without.

    python benchmarks/soak.py                          # 20,000 samples, 4 workers, fork
    python benchmarks/soak.py --start-method spawn --kill-every 3

A thread in the main process SIGKILLs a random live worker every ~``--kill-every``
seconds (jittered ±50%) while the loop runs. conveyor must replace each one and
re-send its tasks: the script checks that every index arrives exactly once, in
order, with its own data, then prints a Markdown table (stdout) comparing
throughput with and without kills. Exit status 1 if a check fails. See
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from conveyor import DataLoader, WorkerRestartedWarning

# Processes multiprocessing starts for itself: never ours to kill.
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


class Vectors:
    """Sample ``i``: 64 float32 values equal to ``i``, and the label ``i``.

    ``sample_ms`` of sleep stands in for reading the sample from disk or network,
    so the epoch lasts long enough to see several kills on a small machine.
    """

    def __init__(self, length: int, dim: int, sample_ms: float) -> None:
        self.length = length
        self.dim = dim
        self.sample_s = sample_ms / 1000

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if self.sample_s:
            time.sleep(self.sample_s)
        return np.full(self.dim, index, dtype=np.float32), index


def worker_pids(min_age_s: float) -> list[int]:
    """Live conveyor workers of this process, up for at least ``min_age_s``.

    Under fork and spawn they are our children; under forkserver, the fork
    server's. A worker killed during start-up, or killed again on the very task
    it was retrying, is (rightly) treated by conveyor as a fault that repeats;
    the minimum age keeps this soak about independent kills, like an OOM killer's.
    """
    me = psutil.Process()
    now = time.time()
    pids = []
    for proc in me.children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            if proc.ppid() == me.pid and any(h in cmdline for h in _HELPERS):
                continue  # the helper itself; the fork server's children are workers
            if proc.status() == psutil.STATUS_ZOMBIE or now - proc.create_time() < min_age_s:
                continue
        except psutil.Error:
            continue
        pids.append(proc.pid)
    return pids


class Killer(threading.Thread):
    """SIGKILLs a random live worker every ~``every`` seconds until stopped."""

    def __init__(self, every: float, min_age_s: float, seed: int) -> None:
        super().__init__(name="soak-killer", daemon=True)
        self.every = every
        self.min_age_s = min_age_s
        self.rng = random.Random(seed)
        self.stopped = threading.Event()
        self.kills = 0

    def run(self) -> None:
        while not self.stopped.wait(self.every * self.rng.uniform(0.5, 1.5)):
            pids = worker_pids(self.min_age_s)
            if not pids:
                continue
            try:
                os.kill(self.rng.choice(pids), signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills += 1


@dataclass
class Run:
    samples: int
    wall_s: float
    kills: int
    restarts: int
    retried: int
    warnings: int
    problems: list[str]

    @property
    def rate(self) -> float:
        return self.samples / self.wall_s


def run_epoch(args: argparse.Namespace, kill: bool) -> Run:
    killer = Killer(args.kill_every, args.min_age, args.seed) if kill else None
    labels: list[Any] = []
    problems: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", WorkerRestartedWarning)
        # More workers than cores is the point on a small machine: not worth a warning.
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        loader = DataLoader(
            Vectors(args.samples, args.dim, args.sample_ms),
            batch_size=args.batch_size,
            num_workers=args.workers,
            multiprocessing_context=args.start_method,
            max_worker_restarts=args.max_worker_restarts,
        )
        started = time.perf_counter()
        if killer is not None:
            killer.start()
        try:
            for values, label in loader:
                label = np.asarray(label)
                if not np.array_equal(np.asarray(values)[:, 0], label):
                    problems.append(f"batch of labels {label[:4]}... holds another sample's data")
                labels.append(label)
        except Exception as exc:  # report it with the rest: a soak must say how far it got
            problems.append(f"the epoch raised {type(exc).__name__}: {exc}")
        finally:
            if killer is not None:
                killer.stopped.set()
                killer.join()
        wall = time.perf_counter() - started
    delivered = np.concatenate(labels) if labels else np.empty(0, dtype=np.int64)
    if not np.array_equal(delivered, np.arange(args.samples)):
        seen, counts = np.unique(delivered, return_counts=True)
        problems.append(
            f"delivered {delivered.size} samples, {seen.size} distinct, "
            f"{int((counts > 1).sum())} repeated, {args.samples - seen.size} missing, "
            f"in order: {bool(np.all(np.diff(delivered) > 0))}"
        )
    restarted = [w for w in caught if issubclass(w.category, WorkerRestartedWarning)]
    problems += [
        f"restart warning without SIGKILL: {str(w.message)[:200]}"
        for w in restarted
        if "SIGKILL (-9)" not in str(w.message)
    ]
    stats = loader.statistics()
    return Run(
        samples=int(delivered.size),
        wall_s=wall,
        kills=killer.kills if killer is not None else 0,
        restarts=stats.worker_restarts if stats is not None else -1,
        retried=stats.tasks_retried if stats is not None else -1,
        warnings=len(restarted),
        problems=problems,
    )


def report(args: argparse.Namespace, calm: Run, killed: Run) -> str:
    lost = 100 * (1 - killed.rate / calm.rate)
    rows = [
        ("samples/s without kills", f"{calm.rate:,.0f}"),
        ("samples/s with kills", f"{killed.rate:,.0f}"),
        ("throughput lost to recovery", f"{lost:.1f}%"),
        ("kills (SIGKILL sent)", f"{killed.kills}"),
        ("worker restarts", f"{killed.restarts} ({killed.warnings} warnings)"),
        ("tasks retried", f"{killed.retried}"),
        ("wall time without kills", f"{calm.wall_s:.1f} s"),
        ("wall time with kills", f"{killed.wall_s:.1f} s"),
        ("every index once, in order", "yes" if not (calm.problems or killed.problems) else "NO"),
    ]
    head = (
        f"Soak: {args.samples:,} samples of {args.dim} float32, batch {args.batch_size}, "
        f"{args.workers} workers ({args.start_method}), {args.sample_ms} ms a sample, a "
        f"SIGKILL every ~{args.kill_every} s, {os.cpu_count()} CPUs\n\n"
    )
    table = "| metric | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    return head + table


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=64, help="float32 values per sample")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    p.add_argument("--sample-ms", type=float, default=2.0, help="simulated I/O per sample")
    p.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    p.add_argument(
        "--min-age",
        type=float,
        default=None,
        help="only kill workers up this long (default: 0.5 s under fork, 3 s otherwise, "
        "past start-up)",
    )
    p.add_argument("--max-worker-restarts", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.min_age is None:
        args.min_age = 0.5 if args.start_method == "fork" else 3.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print("epoch without kills...", file=sys.stderr)
    calm = run_epoch(args, kill=False)
    print("epoch with kills...", file=sys.stderr)
    killed = run_epoch(args, kill=True)
    print(report(args, calm, killed))
    for name, run in (("without kills", calm), ("with kills", killed)):
        for problem in run.problems:
            print(f"FAILED ({name}): {problem}", file=sys.stderr)
    return 1 if calm.problems or killed.problems else 0


if __name__ == "__main__":  # guard: spawned workers may re-import this file
    raise SystemExit(main())
