"""Which kind of worker a loader's ``worker_method`` names: the pool that runs them."""

from __future__ import annotations

import functools

from ..config import LoaderConfig
from .api import PoolFactory
from .pool import WorkerPool
from .threads import ThreadPool

__all__ = ["pool_factory"]


def pool_factory(config: LoaderConfig) -> PoolFactory:
    """Processes (the default), threads, or Ray actors."""
    if config.in_threads:
        return functools.partial(ThreadPool, timeout=config.timeout)
    if config.remote:
        from .ray_pool import RayPool  # Ray itself is imported when it starts

        return functools.partial(RayPool, options=config.worker_options)
    if config.threads_per_worker > 1:
        return functools.partial(WorkerPool, threads_per_worker=config.threads_per_worker)
    return WorkerPool
