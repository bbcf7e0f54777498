"""torch's own checks of the worker arguments, in torch's words (tests compare them)."""

from __future__ import annotations

from .diagnostics import environment

__all__ = ["too_many_workers", "worker_arguments"]


def worker_arguments(
    num_workers: int, timeout: float, prefetch_factor: int | None, persistent_workers: bool
) -> int | None:
    """The ``prefetch_factor`` to use (torch's default of 2 with workers), or torch's
    ``ValueError`` for a combination it refuses."""
    if num_workers < 0:
        raise ValueError(
            "num_workers option should be non-negative; "
            "use num_workers=0 to disable multiprocessing."
        )
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            "prefetch_factor option could only be specified in multiprocessing. "
            "Let num_workers > 0 to enable multiprocessing, otherwise set "
            "prefetch_factor to None."
        )
    if num_workers > 0 and prefetch_factor is None:
        prefetch_factor = 2
    elif prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    return prefetch_factor


def too_many_workers(num_workers: int) -> str | None:
    """torch's warning when worker processes outnumber the usable CPUs (None: they don't)."""
    cpus = environment.affinity()  # torch counts the affinity mask too
    if num_workers <= cpus:
        return None
    return (
        f"This DataLoader will create {num_workers} worker processes in total. "
        f"Our suggested max number of worker in current system is {cpus}, which is "
        "smaller than what this DataLoader is going to create. Please be aware that "
        "excessive worker creation might get DataLoader running slow or even freeze, "
        "lower the worker number to avoid potential slowness/freeze if necessary."
    )
