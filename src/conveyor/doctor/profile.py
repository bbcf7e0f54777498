"""What doctor measured: one record per loader run, and the profile that holds them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoaderRun", "Profile", "ThreadProbe"]


@dataclass(frozen=True)
class LoaderRun:
    """One loader at one worker count: time to the first batch, then throughput."""

    num_workers: int
    first_batch_s: float | None = None
    samples_per_s: float | None = None
    batches: int = 0  # timed, after the first
    error: str = ""  # "Type: message" (its first lines) when the loader raised
    refused: str = ""  # the code of the pre-flight finding that kept it from starting
    warnings: tuple[str, ...] = ()
    batch_bytes: tuple[int, int] | None = None  # the first batch's (arrays, other)


@dataclass(frozen=True)
class ThreadProbe:
    """The same samples fetched by one thread, then by ``threads`` threads at once: does
    the dataset hold the GIL, release it, or mostly wait?"""

    threads: int
    one_thread_per_s: float  # samples/s
    many_threads_per_s: float
    cpu_share: float  # CPU time / wall time of the one-thread pass (1.0: all computing)

    @property
    def speedup(self) -> float:
        return self.many_threads_per_s / self.one_thread_per_s if self.one_thread_per_s else 0.0


@dataclass(frozen=True)
class Profile:
    """What doctor measured; :func:`~conveyor.doctor.advise` derives the advice from it."""

    batch_size: int | None
    cpus: int
    start_method: str
    prefetch_factor: int = 2
    fetch_median_s: float | None = None
    fetch_p95_s: float | None = None
    fetch_count: int = 0
    runs: tuple[LoaderRun, ...] = ()
    problems: tuple[str, ...] = ()  # a sample that failed in-process
    threads: ThreadProbe | None = None  # map-style datasets whose samples all loaded
    thread_hazards: tuple[str, ...] = ()  # where thread workers would share a handle or rng

    @property
    def batch_parts(self) -> tuple[int, int] | None:
        """One batch's bytes as ``(arrays, other)``, from the first run that loaded one."""
        return next((r.batch_bytes for r in self.runs if r.batch_bytes is not None), None)

    @property
    def batch_bytes(self) -> int | None:
        parts = self.batch_parts
        return None if parts is None else sum(parts)

    @property
    def fastest(self) -> LoaderRun | None:
        """The run with the best throughput, if at least two runs were measured."""
        done = [r for r in self.runs if r.samples_per_s]
        return max(done, key=lambda r: r.samples_per_s or 0.0) if len(done) > 1 else None

    @property
    def errors(self) -> int:
        """Distinct failures: one broken sample fails every run the same way."""
        return len({*self.problems, *(r.error for r in self.runs if r.error)})
