"""What to change, from the pre-flight findings and the measured numbers (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.diagnostics.findings import Finding
from conveyor.doctor.profile import Profile, ThreadProbe
from conveyor.doctor.units import fmt_bytes, fmt_seconds

__all__ = ["advise"]

CHEAP_SAMPLE_S = 50e-6  # below: a worker's cost per batch outweighs the fetching it saves
SLOW_SAMPLE_S = 5e-3  # above: fetching dominates, and more workers help
LARGE_BATCH_BYTES = 50_000_000
SLOW_START_S = 1.0  # workers' first batch slower than this: worth starting them once
SPIKY_RATIO = 10.0  # p95 this many times the median: a few samples are much slower
WAITING_CPU_SHARE = 0.5  # one thread computing less of the time than this: it mostly waits
RELEASES_GIL = 0.7  # threads scaling to this share of min(threads, CPUs): the GIL is free


def advise(profile: Profile, findings: Sequence[Finding] = ()) -> list[str]:
    """What to change, from the pre-flight findings and the numbers in ``profile``.

    Each item says what was seen, then what to do: the findings' fixes (worst first),
    a failure to load, then advice from fetch time, batch size and start-up time.
    """
    advice = [f"[{f.code}] {_place(f)}: {f.fix}" for f in findings if f.fix]
    failed = [p.split(" raised ")[0] for p in profile.problems]
    failed += [f"num_workers={r.num_workers}" for r in profile.runs if r.error]
    if failed:
        advice.append(
            f"Loading failed ({', '.join(failed)}; the error is above). Fix it first: a "
            "training loop fails the same way, and the numbers above are incomplete."
        )
    median, p95 = profile.fetch_median_s, profile.fetch_p95_s
    if median is not None and median < CHEAP_SAMPLE_S:
        advice.append(
            f"Samples are cheap (median {fmt_seconds(median)}): worker processes cost more "
            "than they save here. Keep num_workers low, or 0."
        )
    elif median is not None and median > SLOW_SAMPLE_S:
        advice.append(
            f"Samples are slow (median {fmt_seconds(median)}, about {1 / median:,.0f} "
            f"samples/s per process): use more workers, up to the {profile.cpus} CPUs this "
            f"process may use (num_workers={profile.cpus})."
        )
    if median and p95 is not None and p95 > SPIKY_RATIO * median and p95 > 1e-3:
        advice.append(
            f"A few samples are much slower than most (p95 {fmt_seconds(p95)}, median "
            f"{fmt_seconds(median)}). A batch waits for its slowest sample; a higher "
            "prefetch_factor evens this out."
        )
    size = profile.batch_bytes
    if size is not None and size > LARGE_BATCH_BYTES:
        workers = max((r.num_workers for r in profile.runs), default=0) or 1
        held = workers * profile.prefetch_factor
        advice.append(
            f"Batches are large ({fmt_bytes(size)}): with num_workers={workers} and "
            f"prefetch_factor={profile.prefetch_factor}, {held} batches ({fmt_bytes(held * size)}) "
            "can be in flight. Lower batch_size or prefetch_factor."
        )
    slow = [r for r in profile.runs if r.num_workers and (r.first_batch_s or 0.0) > SLOW_START_S]
    if slow:
        advice.append(
            f"Workers take {fmt_seconds(slow[-1].first_batch_s or 0.0)} to deliver the first "
            f"batch (num_workers={slow[-1].num_workers}, start method {profile.start_method}): "
            "pass persistent_workers=True so they start once, not every epoch."
        )
    if profile.threads is not None:
        advice.append(method_advice(profile.threads, profile.cpus, profile.thread_hazards))
    fastest = profile.fastest
    if fastest is not None:
        advice.append(
            f"Fastest measured: num_workers={fastest.num_workers} "
            f"({fastest.samples_per_s or 0.0:,.0f} samples/s)."
        )
    return advice


def _place(finding: Finding) -> str:
    return finding.where or "environment"


def method_advice(probe: ThreadProbe, cpus: int, hazards: tuple[str, ...] = ()) -> str:
    """Processes or threads, from how the samples fetched in threads; ``hazards`` are what
    thread workers would share (``"dataset.fh (thread-shared-file)"``), to fix first."""
    first = (
        f" First fix what the threads would share: {', '.join(hazards)}; "
        "conveyor.check(loader, worker_method='thread') says why and how."
        if hazards
        else ""
    )
    measured = (
        f"one thread fetched {probe.one_thread_per_s:,.0f} samples/s computing "
        f"{probe.cpu_share:.0%} of the time; {probe.threads} threads fetched "
        f"{probe.many_threads_per_s:,.0f} ({probe.speedup:.1f}x)"
    )
    if probe.cpu_share < WAITING_CPU_SHARE:
        return (
            f"Samples mostly wait ({measured}): use many threads, "
            "worker_method='thread' with num_workers well past the CPUs (16, 32, 64: "
            "as many requests as the storage serves); or, to keep them off the training "
            f"process's GIL, num_workers={cpus} processes of threads_per_worker=16 "
            "threads each (as many requests open, the memory of a few processes)." + first
        )
    if probe.speedup >= max(1.3, RELEASES_GIL * min(probe.threads, cpus)):
        return (
            f"Samples release the GIL ({measured}): thread workers load as fast as "
            f"processes here, with one copy of the dataset: worker_method='thread', "
            f"num_workers={cpus}." + first
        )
    return (
        f"Samples hold the GIL ({measured}): threads cannot run them in parallel; keep "
        "worker processes (worker_method='multiprocessing', the default)."
    )
