"""The verdict: which stage holds the training loop back, in words, with the figures.

Pure: a function of a statistics snapshot and what the machine allows. Each verdict
names the measured figures that led to it and what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..records import LoaderStatistics, StageTimes

__all__ = ["Cause", "Verdict", "diagnose"]

IDLE_LOOP = 0.05  # the loop waiting less than this share of the time: loading keeps up
BUSY_WORKERS = 0.6  # workers busy less than this while the loop waits: they are not the cause
MAIN_SHARE = 0.3  # rebuilding and pinning this share of the loop's wait: the main process
WAITING_CPU = 0.5  # workers active less than this share of their busy time: they wait (I/O)
MIB = 1 << 20


class Cause(str, Enum):
    """What holds the training loop back (``Verdict.cause``); a string, such as
    ``"collate"``, to log or compare."""

    TRAINING = "training"  #: the loop never waits: loading is not the bottleneck
    MAIN_PROCESS = "main-process"  #: workers idle, the main process rebuilds or pins
    COLLATE = "collate"  #: workers busy, mostly in collate_fn
    WAITING = "waiting"  #: workers busy, mostly waiting (I/O): their CPU is idle
    FETCH = "fetch"  #: workers busy computing samples: more workers would help
    CORES = "cores"  #: ... and every core this process may use is already working
    UNKNOWN = "unknown"  #: too little measured yet


@dataclass(frozen=True)
class Verdict:
    """What ``DataLoader.diagnose()`` concludes: ``str(verdict)`` is its text."""

    cause: Cause  #: the stage that holds the training loop back
    text: str  #: what holds the loop back, the figures, and what to do

    def __str__(self) -> str:
        return self.text


def diagnose(stats: LoaderStatistics, cpus: int, *, stages: StageTimes | None = None) -> Verdict:
    """What holds the training loop back in ``stages`` (default: this epoch's)."""
    times = stages or stats.stages
    workers = len(stats.workers)
    if times.batches < 2 or times.seconds <= 0:
        return Verdict(Cause.UNKNOWN, "Too little has been loaded yet to tell (under 2 batches).")
    wait = times.wait_share
    rate = f"{times.samples_per_s:,.0f} samples/s"
    loop = f"the training loop waited for data {wait:.0%} of the time ({rate})"
    busy = times.busy_s / (workers * times.seconds) if workers else 0.0
    main_ms = 1000 * times.per_batch(times.decode_s + times.pin_s)
    if wait < IDLE_LOOP:
        return Verdict(Cause.TRAINING, _not_the_bottleneck(stats, loop, busy, workers))
    if not workers:
        return Verdict(
            Cause.FETCH,
            f"Loading holds training back: {loop}, and samples are loaded in the training "
            f"process itself ({_per_batch(times, 'fetch_s')} fetching and "
            f"{_per_batch(times, 'collate_s')} collating a batch). Use workers: "
            f"num_workers={max(1, cpus)} (or num_workers='auto').",
        )
    main_s = times.decode_s + times.pin_s
    if busy < BUSY_WORKERS and main_s >= MAIN_SHARE * times.wait_s:
        return Verdict(
            Cause.MAIN_PROCESS,
            f"The main process holds training back: {loop} while the workers were busy "
            f"only {busy:.0%} of it; rebuilding and pinning take {main_ms:.2f} ms a batch "
            "there. Make batches cheaper to hand over (fewer, larger arrays rather than "
            "many small objects), or pin in the training step if pin_memory=True costs it.",
        )
    figures = f"{loop}; {workers} worker{'s' if workers > 1 else ''} busy {busy:.0%} of it"
    return _in_the_workers(stats, times, figures, cpus)


def _in_the_workers(stats: LoaderStatistics, times: StageTimes, figures: str, cpus: int) -> Verdict:
    """The verdict when the workers' own work holds training back: collate, waiting,
    too few workers, or every core in use."""
    workers = len(stats.workers)
    worker_s = times.fetch_s + times.collate_s + times.send_s
    if worker_s > 0 and times.collate_s > 0.5 * worker_s:
        return Verdict(
            Cause.COLLATE,
            f"collate_fn holds training back: {figures}, {times.collate_s / worker_s:.0%} "
            f"of their time in collate_fn ({_per_batch(times, 'collate_s')} a batch against "
            f"{_per_batch(times, 'fetch_s')} fetching). Make collate_fn cheaper (pad in "
            "__getitem__, stack arrays, avoid Python loops over elements).",
        )
    active = _active_share(stats, times)
    if active is not None and active < WAITING_CPU:
        return Verdict(
            Cause.WAITING,
            f"Samples mostly wait (I/O): {figures}, yet computing only {active:.0%} of that "
            "time. More requests in flight help, not more cores: "
            f"worker_method='thread' with num_workers well past {cpus} (16, 32, 64).",
        )
    if workers < cpus:
        return Verdict(
            Cause.FETCH,
            f"Fetching samples holds training back: {figures} "
            f"({_per_batch(times, 'fetch_s')} fetching a batch). This process may use "
            f"{cpus} CPUs: raise num_workers to {cpus} (or num_workers='auto'), or use "
            "worker_method='thread' if samples release the GIL (conveyor doctor measures it).",
        )
    return Verdict(
        Cause.CORES,
        f"Fetching samples holds training back and every core is in use: {figures} on "
        f"{cpus} usable CPUs. Make samples cheaper (decode smaller images, cache what does "
        "not change), or move loading to more machines (worker_method='ray').",
    )


def _not_the_bottleneck(stats: LoaderStatistics, loop: str, busy: float, workers: int) -> str:
    text = f"Data loading is not the bottleneck: {loop}."
    needed = math.ceil(busy * workers) + 1 if workers else 0
    if workers and needed < workers:
        spare = workers - needed
        memory = [w.memory_bytes for w in stats.workers if w.memory_bytes]
        freed = f" and about {spare * max(memory) / MIB:,.0f} MiB" if memory else ""
        text += (
            f" The {workers} workers were busy {busy:.0%} of the time: num_workers={needed} "
            f"would keep up and free {spare} cores{freed}."
        )
    return text


def _per_batch(times: StageTimes, name: str) -> str:
    return f"{1000 * times.per_batch(getattr(times, name)):.2f} ms"


def _active_share(stats: LoaderStatistics, times: StageTimes) -> float | None:
    """The share of the workers' busy time they were computing or waiting for a core
    (the rest they waited on I/O), where their kind can say."""
    active = [w.active_s for w in stats.workers]
    if not active or any(a is None for a in active) or times.busy_s <= 0:
        return None
    return sum(a for a in active if a is not None) / times.busy_s
