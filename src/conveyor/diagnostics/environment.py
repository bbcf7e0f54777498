"""The machine's side: CPUs, memory and the open-file limit against what the loader needs.

Only what the kernel says is used: ``os.sched_getaffinity``, the cgroup's CPU
quota and memory limit (v2 ``cpu.max``, ``memory.max``, ``memory.current``;
v1 ``cpu.cfs_quota_us``, ``memory.limit_in_bytes``), psutil's available
memory and ``RLIMIT_NOFILE``. Anything unreadable is left out, never guessed.
A small ``/dev/shm`` is not a problem: conveyor's shared memory is memfd.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass
from pathlib import Path

import psutil

from .findings import ENVIRONMENT, Finding, Severity

__all__ = [
    "FDS_PER_LOADER",
    "FDS_PER_WORKER",
    "Cpus",
    "available_memory",
    "cgroup_memory",
    "cpu_findings",
    "cpus",
    "fd_findings",
    "memory_findings",
    "open_files",
]

# Descriptors the main process holds per running worker, counted (tests/faults/
# test_open_file_limit.py checks this against /proc/self/fd under every start method):
# the task pipe's write end, the result pipe's read end, the stack pipe's read end, the
# write end of conveyor's parent-watch pipe (_workers/parent_watch.py), the process's
# sentinel and the parent-death pipe multiprocessing keeps beside it, the worker's
# memfd, and the duplicate of it that the status page's map holds. Slots are mapped
# without one, so batches the loop keeps cost none.
FDS_PER_WORKER = 8
FDS_PER_LOADER = 1  # the pool's selector
# Fork server, resource tracker, a worker being started (its pipes' other ends, and
# spawn's own pipes: up to 8 more for a moment), the user's own files.
FD_MARGIN = 16
_CGROUP = Path("/sys/fs/cgroup")
_PROC_CGROUP = Path("/proc/self/cgroup")
_UNLIMITED = 1 << 60  # cgroup v1 says "no limit" with a number near 2**63


@dataclass(frozen=True)
class Cpus:
    """CPUs this process may use: its affinity mask, and the cgroup quota (in CPUs)."""

    affinity: int
    quota: float | None = None

    @property
    def usable(self) -> int:
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.ceil(self.quota)))

    def limited_by_quota(self) -> bool:
        return self.quota is not None and self.usable < self.affinity


def affinity() -> int:
    """CPUs this process may run on (the affinity mask; no cgroup files read)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpus() -> Cpus:
    return Cpus(affinity(), _cpu_quota())


def _cgroup_dirs(controller: str) -> list[Path]:
    """This process's cgroup directory for ``controller`` (v2, then v1), then its parents."""
    try:
        lines = _PROC_CGROUP.read_text().splitlines()
    except OSError:
        return []
    found: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base = _CGROUP
        elif controller in controllers.split(","):
            base = _CGROUP / controllers
        else:
            continue
        here = base / path.lstrip("/")
        if not here.is_dir():  # a cgroup namespace: the mount is the process's own cgroup
            here = base
        found += [here, *(p for p in here.parents if p.is_relative_to(base))]
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_quota() -> float | None:
    quotas = []
    for directory in _cgroup_dirs("cpu"):
        v2 = _read(directory / "cpu.max")  # "max 100000" or "200000 100000"
        if v2 is not None:
            limit, _, period = v2.partition(" ")
        else:  # v1: a quota of -1 means none
            limit = _read(directory / "cpu.cfs_quota_us") or ""
            period = _read(directory / "cpu.cfs_period_us") or ""
        if limit.isdigit() and period.isdigit() and int(limit) > 0 and int(period) > 0:
            quotas.append(int(limit) / int(period))
    return min(quotas) if quotas else None


def cgroup_memory() -> tuple[int, int] | None:
    """The tightest cgroup memory limit over this process, and what its cgroup uses.

    Usage leaves out inactive page cache, which the kernel reclaims before it
    kills anything (the "working set", as Kubernetes counts it).
    """
    best: tuple[int, int] | None = None
    for directory in _cgroup_dirs("memory"):
        limit = _number(directory, "memory.max", "memory.limit_in_bytes")
        if limit is None or limit >= _UNLIMITED:
            continue
        usage = _number(directory, "memory.current", "memory.usage_in_bytes") or 0
        usage -= min(usage, _inactive_cache(directory))
        if best is None or limit - usage < best[0] - best[1]:
            best = (limit, usage)
    return best


def _number(directory: Path, *names: str) -> int | None:
    for name in names:
        text = _read(directory / name)
        if text is not None:
            return int(text) if text.isdigit() else None
    return None


def _inactive_cache(directory: Path) -> int:
    for line in (_read(directory / "memory.stat") or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("inactive_file", "total_inactive_file") and value.isdigit():
            return int(value)
    return 0


def available_memory() -> tuple[int, str]:
    """Bytes that can still be allocated, and where that number comes from."""
    available = psutil.virtual_memory().available
    source = "available on this machine"
    limit = cgroup_memory()
    if limit is not None and limit[0] - limit[1] < available:
        available = max(0, limit[0] - limit[1])
        source = f"left under this container's memory limit of {_size(limit[0])}"
    return available, source


def open_files() -> tuple[int, int, int]:
    """File descriptors open now, and the soft and hard ``RLIMIT_NOFILE``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        now = len(os.listdir("/proc/self/fd"))
    except OSError:
        now = 0
    return now, soft, hard


def cpu_findings(num_workers: int, *, automatic: bool = False) -> list[Finding]:
    """More workers than usable CPUs. ``automatic``: only where torch's own warning is silent
    (it counts the affinity mask, not a container's CPU quota)."""
    have = cpus()
    if num_workers <= have.usable or (automatic and num_workers > have.affinity):
        return []
    return [
        Finding(
            code="too-many-workers",
            severity=Severity.WARNING,
            where=ENVIRONMENT,
            what=f"{num_workers} workers for {have.usable} usable CPUs",
            why=(
                f"This container's CPU quota is {have.quota:g} of the {have.affinity} CPUs. "
                if have.limited_by_quota()
                else ""
            )
            + "Workers beyond the CPUs take turns on them: batches come no faster, and each "
            "worker costs memory and start-up time.",
            fix=f"use num_workers={have.usable} or fewer.",
        )
    ]


def fd_findings(num_workers: int) -> list[Finding]:
    """An open-file limit that the workers' pipes and memory files would exceed: an
    ERROR when the running workers alone would not fit (refused before any starts,
    instead of 'Too many open files' halfway through starting them), a WARNING when
    they fit without the margin (starting one may then fail, up front too)."""
    now, soft, hard = open_files()
    need = now + FDS_PER_WORKER * num_workers + FD_MARGIN
    if soft == resource.RLIM_INFINITY or need <= soft:
        return []
    sure = now + FDS_PER_WORKER * num_workers + FDS_PER_LOADER > soft
    if hard == resource.RLIM_INFINITY or need <= hard:
        target = need * 2 if hard == resource.RLIM_INFINITY else min(hard, max(need * 2, 4096))
        fix = (
            f"raise the soft limit: `ulimit -n {target}` in the shell that starts the program, "
            f"or resource.setrlimit(resource.RLIMIT_NOFILE, ({target}, {hard})) at its start."
        )
    else:
        fix = f"use at most {max(0, (hard - now - FD_MARGIN) // FDS_PER_WORKER)} workers."
    consequence = (
        "the workers cannot all start: the last would fail with 'Too many open files'"
        if sure
        else "that leaves less than a margin for starting them and for the program's own "
        "files: past the limit, opening a file fails with 'Too many open files'"
    )
    return [
        Finding(
            code="open-file-limit",
            severity=Severity.ERROR if sure else Severity.WARNING,
            where=ENVIRONMENT,
            what=f"The open-file limit ({soft}) is too low for {num_workers} workers",
            why=f"This process has {now} files open and each worker needs {FDS_PER_WORKER} "
            f"more ({need} in all, with a margin): {consequence}.",
            fix=fix,
        )
    ]


def memory_findings(num_workers: int, prefetch_factor: int, batch_bytes: int) -> list[Finding]:
    """Prefetched batches that would not fit in the memory left (measured batch size)."""
    in_flight = num_workers * prefetch_factor + 1  # prefetched, plus the one being used
    need = batch_bytes * in_flight
    available, source = available_memory()
    if need <= available:
        return []
    return [
        Finding(
            code="low-memory",
            severity=Severity.WARNING,
            where=ENVIRONMENT,
            what=f"The prefetched batches need about {_size(need)} but only {_size(available)} "
            f"is {source}",
            why=f"{num_workers} workers times prefetch_factor={prefetch_factor} batches of "
            f"{_size(batch_bytes)} (the first batch, measured) are in memory at once; when "
            "memory runs out the kernel kills a worker (SIGKILL).",
            fix="lower prefetch_factor, num_workers or batch_size, or give the program more "
            "memory.",
        )
    ]


def _size(count: float) -> str:
    if count < 1024:
        return f"{count:,.0f} bytes"
    units = ["KB", "MB", "GB", "TB"]
    count /= 1024
    while count >= 1024 and len(units) > 1:
        count /= 1024
        units.pop(0)
    return f"{count:,.1f} {units[0]}"
