"""Datasets for the Ray workers' tests, importable by the actors (see conftest.py)."""

from __future__ import annotations

import ctypes
import os
import random
from typing import Any

import numpy as np

import conveyor
from conveyor import get_worker_info


def _here() -> dict[str, Any]:
    import ray

    info = get_worker_info()
    assert info is not None, "this dataset runs in workers only"
    context = ray.get_runtime_context()
    return {"worker": info.id, "pid": os.getpid(), "node": context.get_node_id()}


class Where:
    """Sample ``i``: ``i``, and the worker, process and node that fetched it. ``bad``:
    indices whose fetch raises ``ValueError``."""

    def __init__(self, n: int = 24, bad: tuple[int, ...] = ()) -> None:
        self.n = n
        self.bad = bad
        self.tag = -1  # what a worker_init_fn may set on its worker's copy

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i in self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return {"i": i, "tag": self.tag, **_here()}


class Epochs(Where):
    """:class:`Where`, each sample with ``"epoch"``: the last ``set_epoch`` its copy was told."""

    def __init__(self, n: int = 24) -> None:
        super().__init__(n)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**super().__getitem__(i), "epoch": self.epoch}


class Images:
    """Sample ``i``: a 3x64x64 uint8 image filled with ``i % 256``, and ``i``."""

    def __init__(self, n: int = 32) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((3, 64, 64), i % 256, dtype=np.uint8), i


class Draws:
    """Sample ``i``: ``(i, draws from the process's random and NumPy generators, and from
    the worker's own)``, what an augmentation sees."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        info = get_worker_info()
        assert info is not None
        rng = info.rng
        assert rng is not None
        own = (rng.random_generator.random(), float(rng.numpy_generator.random()))
        return (i, random.random(), float(np.random.rand()), *own)


class CountsPickles:
    """A dataset that counts, in the driver, how often it is pickled."""

    pickled = 0

    def __init__(self, n: int = 12) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __getstate__(self) -> dict[str, Any]:
        type(self).pickled += 1
        return self.__dict__


class Shards(conveyor.IterableDataset):
    """torch's sharding pattern: each worker yields its share of ``range(n)``."""

    def __init__(self, n: int = 30) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = get_worker_info()
        assert info is not None and info.worker_method == "ray"
        return iter(range(info.id, self.n, info.num_workers))


class Faulty:
    """Sample ``i`` is ``i``; fetching a sample may go wrong on purpose.

    ``segfault``: indices that crash their worker's process (a SIGSEGV in native code),
    every time. ``hold``: the first time that index is fetched, the fetch blocks on a
    FIFO (``gate``) the test controls, or until its worker is killed; later fetches go
    through (a marker file remembers)."""

    def __init__(
        self,
        n: int = 24,
        segfault: tuple[int, ...] = (),
        hold: int | None = None,
        gate: str = "",
    ) -> None:
        self.n = n
        self.segfault = segfault
        self.hold = hold
        self.gate = gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i in self.segfault:
            ctypes.string_at(0)  # a read of address 0: SIGSEGV
        if i == self.hold and _first_time(self.gate + ".held"):
            with open(self.gate):  # blocks until the test opens the FIFO for writing
                pass
        return {"i": i, **_here()}


def _first_time(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True
