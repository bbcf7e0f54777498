"""``num_workers="auto"``: how many workers, from what the process may use and what it sees.

Pure: the loop measures (a window of batches: the loop's wait, the workers' busy share,
one worker's memory) and asks :meth:`Autotuner.decide`; the tuner answers add one,
retire one, or keep, with the reason in words. It starts from what the process may
really use (the cgroup's CPU quota and cpuset, the memory limit), adds workers while
the training loop waits for busy workers and cores are free, retires idle ones when the
loop never waits, and never goes past the memory budget. One step at a time, then a
window to see its effect, so it settles rather than oscillates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..records import StageTimes
from .progress import logger

if TYPE_CHECKING:
    from .._workers.kinds import WorkerKind

__all__ = ["Autotuner", "Decision", "Limits", "auto_workers"]

WAITING = 0.05  # the loop waiting more than this share of a window: loading holds it back
BUSY = 0.75  # workers busy more than this: more of them would help
IDLE = 0.4  # workers busy less than this while the loop never waits: one can go
WAITING_IO = 0.5  # workers active less than this share of their busy time wait on I/O
MEMORY_MARGIN = 0.8  # of the memory left, what workers may take
WINDOW_BATCHES = 8  # a window is at least this many batches...
WINDOW_S = 1.0  # ... and this long
SETTLED_AFTER = 3  # windows in a row without a change


@dataclass(frozen=True)
class Limits:
    """What the process may use: CPUs (quota and cpuset), the most workers of this kind."""

    cpus: int
    most: int


@dataclass(frozen=True)
class Decision:
    change: int  # +1 add a worker, -1 retire one, 0 keep
    why: str


class Autotuner:
    def __init__(self, limits: Limits, *, threads: bool = False) -> None:
        self.limits = limits
        self.threads = threads
        self.quiet = 0  # windows in a row without a change
        self.history: list[tuple[int, str]] = []  # (workers, why) at each change
        self.held_back: str | None = None  # the latest reason it could not add one

    def first(self) -> Decision:
        """Where to start: one worker per usable CPU (threads: twice that, since they
        mostly wait or release the GIL), within the kind's most."""
        wanted = self.limits.cpus * (2 if self.threads else 1)
        count = max(1, min(wanted, self.limits.most))
        why = (
            f"{count} workers to start: {self.limits.cpus} CPUs usable by this process "
            f"(affinity and cgroup quota){', two threads each' if self.threads else ''}"
        )
        self.history.append((count, why))
        return Decision(count, why)

    @property
    def settled(self) -> bool:
        return self.quiet >= SETTLED_AFTER

    @staticmethod
    def window_done(window: StageTimes) -> bool:
        return window.batches >= WINDOW_BATCHES and window.seconds >= WINDOW_S

    def decide(
        self,
        window: StageTimes,
        workers: int,
        worker_memory: int | None = None,
        memory_left: int | None = None,
        active_s: float | None = None,
    ) -> Decision:
        """After a window: add a worker, retire one, or keep. ``worker_memory``: what one
        worker takes, measured (None: its kind cannot say); ``memory_left``: what the
        machine or cgroup has left (None: no limit known); ``active_s``: the workers'
        seconds running or runnable in the window (the rest of their busy time they
        waited on I/O: then more of them than cores help)."""
        waiting = window.wait_share
        busy = window.busy_s / (workers * window.seconds) if workers and window.seconds else 0.0
        seen = f"the loop waited {waiting:.0%} of the last {window.seconds:.1f} s, {workers} "
        seen += f"workers busy {busy:.0%}"
        decision = Decision(0, f"kept {workers} workers: {seen}")
        if waiting > WAITING and busy > BUSY:
            io = active_s is not None and active_s < WAITING_IO * window.busy_s
            room = self._room(workers, worker_memory, memory_left, io)
            # Threads mostly wait: grow by half at a time (one by one, 64 would take a
            # minute); processes one at a time (cores are few).
            more = min(max(1, workers // 2), self.limits.most - workers) if self.threads else 1
            if room is None:
                decision = Decision(more, f"added {_workers(more)}: {seen}")
            else:
                decision = Decision(0, f"kept {workers} workers ({room}): {seen}")
                self.held_back = decision.why
        elif waiting <= WAITING and busy < IDLE and workers > 1:
            decision = Decision(-1, f"retired a worker: {seen}")
        if decision.change:
            self.quiet = 0
            self.history.append((workers + decision.change, decision.why))
        else:
            self.quiet += 1
        return decision

    def _room(
        self, workers: int, worker_memory: int | None, left: int | None, io: bool = False
    ) -> str | None:
        """Why no worker can be added (None: one can). Workers that mostly wait on I/O
        may outnumber the cores."""
        if workers >= self.limits.most:
            return f"the most for this kind of worker, {self.limits.most}"
        if not self.threads and not io and workers >= self.limits.cpus:
            return f"one per usable CPU, {self.limits.cpus}"
        if left is not None and worker_memory and worker_memory > MEMORY_MARGIN * left:
            return (
                f"one more worker ({worker_memory >> 20:,} MiB) would not fit the memory left "
                f"({left >> 20:,} MiB)"
            )
        return None


def _workers(count: int) -> str:
    return "a worker" if count == 1 else f"{count} workers"


THREADS_MOST = 64  # thread workers mostly wait: many more than cores, within reason
PROCESSES_PER_CPU = 4  # worker processes beyond the cores only while they wait on I/O


def auto_workers(
    num_workers: object, kind: WorkerKind | None, threads_per_worker: object = 1
) -> Autotuner | None:
    """For ``num_workers="auto"``, a tuner that has chosen where to start (logged on the
    ``conveyor`` logger); None for a count. ``kind`` None: ``worker_method`` names none
    (the loader says so next), sized as worker processes meanwhile."""
    if num_workers != "auto":
        if isinstance(num_workers, str):
            raise ConfigError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}")
        if threads_per_worker != 1 and num_workers == 0:
            raise ConfigError(
                f"threads_per_worker={threads_per_worker!r} runs threads inside worker "
                "processes, and num_workers=0 starts none: give num_workers > 0 (the number "
                "of processes), or worker_method='thread' for threads in this process."
            )
        return None
    if threads_per_worker != 1:
        raise ConfigError(
            f"num_workers='auto' adds and retires single workers as it measures; with "
            f"threads_per_worker={threads_per_worker!r} a worker is a process of several "
            "threads. Give num_workers as a count of processes, or use num_workers='auto' "
            "with worker_method='thread' (it then counts threads)."
        )
    if kind is not None and not kind.local:
        raise ConfigError(
            "num_workers='auto' sizes the workers to this machine's CPUs; with "
            "worker_method='ray' they run on the cluster's nodes. Give num_workers as a "
            "count (the workers the loader may use there; worker_options={'num_cpus': ...} "
            "sets each one's share)."
        )
    from ..diagnostics.environment import cpus

    usable = cpus().usable
    threads = kind is not None and kind.in_this_process
    most = THREADS_MOST if threads else PROCESSES_PER_CPU * usable
    tuner = Autotuner(Limits(usable, most), threads=threads)
    logger.info("num_workers='auto': %s", tuner.first().why)
    return tuner
