"""The machine check: a workload's plain loop in N bare processes side by side (no loader)
against one. It shows the most N workers can reach on this machine right now, and what the
work itself costs in CPU when N processes share the cores."""

from __future__ import annotations

import math
import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from conveyor_bench.measure import touch


@dataclass(frozen=True)
class MachineCheck:
    """What ``processes`` bare processes (no loader) doing a workload's plain loop get done
    against one: the most that many workers can reach on this machine right now, and what
    the work itself costs in CPU when that many processes run it side by side."""

    processes: int
    speedup: float  # the median over the pairs of: processes x one's time / theirs
    single_cpu_ms_per_batch: float  # one process alone (median over the pairs)
    parallel_cpu_ms_per_batch: float  # side by side (the median over the pairs)
    batches: int  # each process's, in each run


def _run_batches(loop: Iterable[Any]) -> None:
    for batch in loop:
        touch(batch)


def _timed_copy(
    loop: Callable[[int], Iterable[Any]], batches: int, start: Any, results: Connection
) -> None:
    """One of the parallel copies: warm up alone, start with the others, report back."""
    _run_batches(loop(1))  # this process's own first-touch costs, before the clock
    start.wait()
    t0, cpu0 = time.perf_counter(), time.process_time()
    _run_batches(loop(batches))
    results.send((t0, time.perf_counter(), time.process_time() - cpu0))
    results.close()


def _side_by_side(
    loop: Callable[[int], Iterable[Any]], processes: int, batches: int
) -> tuple[float, float]:
    """Run ``loop(batches)`` in ``processes`` forked copies at once; their wall time
    (first start to last end, timed in the copies: forking and exiting left out) and
    their CPU seconds in all."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    start = context.Barrier(processes)
    pipes = [context.Pipe(duplex=False) for _ in range(processes)]
    copies = [
        context.Process(target=_timed_copy, args=(loop, batches, start, sender), daemon=True)
        for _, sender in pipes
    ]
    for proc in copies:
        proc.start()
    for _, sender in pipes:
        sender.close()
    reports = [receiver.recv() for receiver, _ in pipes]
    for proc in copies:
        proc.join()
    wall = max(end for _, end, _ in reports) - min(begin for begin, _, _ in reports)
    return wall, sum(cpu for _, _, cpu in reports)


def machine_check(
    loop: Callable[[int], Iterable[Any]],
    processes: int,
    seconds: float,
    max_batches: int,
    pairs: int = 3,
    least: int = 1,
) -> MachineCheck:
    """Time ``loop(n)`` (a plain loop of ``n`` batches, ``n`` chosen to take about
    ``seconds``, at least ``least`` and at most ``max_batches``) alone, then ``processes``
    copies of it side by side in forked processes, ``pairs`` times back to back; the median
    ratio, so a burst of load from elsewhere skews one pair, not the answer. Without fork,
    ``loop`` must pickle."""
    _run_batches(loop(1))  # warm: first-touch costs, lazy imports
    start = time.perf_counter()
    _run_batches(loop(1))
    once = time.perf_counter() - start
    batches = min(max_batches, max(least, math.ceil(seconds / max(once, 1e-9))))
    ratios, single_cpu, parallel_cpu = [], [], []
    for _ in range(pairs):
        cpu0, start = time.process_time(), time.perf_counter()
        _run_batches(loop(batches))
        single = time.perf_counter() - start
        single_cpu.append((time.process_time() - cpu0) / batches)
        wall, cpu = _side_by_side(loop, processes, batches)
        ratios.append(processes * single / wall)
        parallel_cpu.append(cpu / (processes * batches))
    return MachineCheck(
        processes,
        statistics.median(ratios),
        1000 * statistics.median(single_cpu),
        1000 * statistics.median(parallel_cpu),
        batches,
    )
