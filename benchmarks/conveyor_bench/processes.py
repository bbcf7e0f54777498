"""The loader's process tree as the benchmark sees it: the main process's descendants (its
workers; under ``forkserver`` the fork server's children are among them), less
multiprocessing's own helpers. Their CPU time and minor page faults (from ``/proc``), the
tree's RSS, and the processes a dropped loader leaves behind."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from dataclasses import dataclass

import psutil

# multiprocessing's own helpers outlive any one loader by design; they are not leaks.
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
_EXIT_GRACE_S = 10.0


def _process_tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_SCHEDSTAT = os.path.exists("/proc/self/task") and os.path.exists("/proc/self/schedstat")


def _proc_stat(pid: int) -> tuple[float, int] | None:
    """CPU seconds and minor page faults of ``pid``, from ``/proc``: the time its threads
    ran, in nanoseconds (``schedstat``) where the kernel keeps it, else its user + system
    time in clock ticks (10 ms: coarse over a short window)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # After "pid (comm) ": state is field 3; minflt is field 10, utime 14, stime 15.
    fields = text[text.rindex(b")") + 2 :].split()
    if _SCHEDSTAT:
        return _ran_s(pid), int(fields[7])
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[7])


def _ran_s(pid: int) -> float:
    """Seconds the threads of ``pid`` have run (the first figure of each one's
    ``schedstat``: nanoseconds on a CPU); a thread that ends meanwhile is left out."""
    total = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat", "rb") as schedstat:
                total += int(schedstat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


@dataclass(frozen=True)
class TreeUsage:
    """CPU seconds and minor page faults of each worker process: the main process's
    descendants (the fork server's children under ``forkserver`` are among them),
    multiprocessing's own helpers left out. Faults are None where ``/proc`` is missing."""

    usage: dict[int, tuple[float, int | None]]

    @staticmethod
    def read() -> TreeUsage:
        usage: dict[int, tuple[float, int | None]] = {}
        for proc in psutil.Process().children(recursive=True):
            if _is_helper(proc):
                continue
            stat = _proc_stat(proc.pid)
            if stat is not None:
                usage[proc.pid] = stat
                continue
            try:  # no /proc: CPU only
                times = proc.cpu_times()
            except psutil.Error:
                continue
            usage[proc.pid] = (times.user + times.system, None)
        return TreeUsage(usage)

    def since(self, before: TreeUsage) -> tuple[float, int | None]:
        """CPU seconds and faults since ``before`` of the processes alive now (one that
        started meanwhile counts from its start; one that ended meanwhile is not seen)."""
        cpu, faults, known = 0.0, 0, True
        for pid, (now_cpu, now_faults) in self.usage.items():
            then_cpu, then_faults = before.usage.get(pid, (0.0, 0))
            cpu += now_cpu - then_cpu
            if now_faults is None or then_faults is None:
                known = False
            else:
                faults += now_faults - then_faults
        return cpu, faults if known else None


def tree_rss() -> int:
    total = 0
    for proc in _process_tree():
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


@dataclass(frozen=True)
class TreePss:
    """Memory held as PSS: pages shared by several processes (a forked dataset) are
    counted once, split among them, so sums are what the processes really hold."""

    own: int  # this process (thread workers live here)
    workers: int  # its descendants, multiprocessing's helpers left out

    @staticmethod
    def read() -> TreePss | None:
        """Now; None where it cannot be read."""
        own = workers = 0
        for proc in _process_tree():
            mine = proc.pid == os.getpid()
            if not mine and _is_helper(proc):
                continue
            try:
                pss = int(proc.memory_full_info().pss)
            except (psutil.Error, AttributeError):
                return None
            if mine:
                own = pss
            else:
                workers += pss
        return TreePss(own, workers)


def pss_added(before: TreePss) -> tuple[int, int] | None:
    """The memory a loader added since ``before`` (PSS): in all, and in its workers."""
    now = TreePss.read()
    if now is None:
        return None
    return now.own - before.own + now.workers, now.workers


def peak_added(peak: int | None, before: TreePss | None) -> int | None:
    """The peak of the process tree's PSS over what it was before the loader was made."""
    if peak is None or before is None:
        return None
    return peak - (before.own + before.workers)


def _pss_of(pid: int) -> int | None:
    """A process's PSS in bytes, from ``/proc/<pid>/smaps_rollup`` (one summed read: far
    cheaper than psutil's walk of every map); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class PeakPss:
    """The largest PSS of the whole process tree (this process and its workers, the
    helpers left out) while it runs: a thread reads it over and over (each reading is a
    few files of ``/proc``; the kernel sums each process's pages), so a peak between two
    of them lasts less than a reading."""

    def __init__(self) -> None:
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        me = psutil.Process()
        kids = [p for p in me.children(recursive=True) if not _is_helper(p)]
        self._pids = [me.pid, *(p.pid for p in kids)]  # (a window's workers live through it)
        self._thread = threading.Thread(target=self._run, name="bench-peak-pss", daemon=True)

    @classmethod
    def start(cls) -> PeakPss | None:
        """Sampling from now; None where ``/proc`` has no ``smaps_rollup``."""
        if _pss_of(os.getpid()) is None:
            return None
        sampler = cls()
        sampler._thread.start()
        return sampler

    def _run(self) -> None:
        while True:
            total = 0
            for pid in self._pids:
                total += _pss_of(pid) or 0
            self.peak = max(self.peak, total)
            self.samples += 1
            if self._stop.wait(_PSS_EVERY_S):
                return

    def stop(self) -> int:
        """Stop sampling; the peak seen."""
        self._stop.set()
        self._thread.join()
        return self.peak


_PSS_EVERY_S = 0.002  # between readings: the loop being measured keeps the cores


def _is_helper(proc: psutil.Process) -> bool:
    """Whether ``proc`` is one of multiprocessing's helpers (not a fork server's child: a
    forked child keeps its parent's command line)."""
    try:
        cmdline = " ".join(proc.cmdline())
        parent = proc.parent()
        inherited = " ".join(parent.cmdline()) if parent is not None else ""
    except psutil.Error:
        return False
    return any(name in cmdline and name not in inherited for name in _HELPERS)


def descendants() -> set[int]:
    return {proc.pid for proc in psutil.Process().children(recursive=True)}


def count_leftovers(before: set[int]) -> int:
    """Wait for processes started during the run to exit; count those that do not."""
    gc.collect()
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    new = [p for p in new if not _is_helper(p)]
    _, alive = psutil.wait_procs(new, timeout=_EXIT_GRACE_S)
    return len(alive)
