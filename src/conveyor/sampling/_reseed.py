"""``reseed``: random draws that depend on a sample's position, not on its worker.

torch seeds each worker once (``"worker"``), so what ``__getitem__`` draws from
``random``, NumPy or torch depends on which worker got the sample, and so on
``num_workers``. With ``"batch"`` the three generators are seeded before each
batch from (base seed, epoch, batch position); with ``"sample"`` before each
sample from (base seed, epoch, sample position in the epoch), which also
makes the draws independent of ``batch_size``. Seeding costs a few
microseconds per call (measured in the benchmark).
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from conveyor._workers.scope import GLOBAL_GENERATORS
from conveyor.errors import ConfigError

__all__ = ["RESEED", "Reseed", "check_reseed", "kept_global_rngs"]

RESEED = ("worker", "batch", "sample")
_MASK64 = (1 << 64) - 1
_BATCH, _SAMPLE, _COLLATE = 1, 2, 3  # separate streams for the three kinds of position


def check_reseed(value: object) -> str:
    if value not in RESEED:
        raise ConfigError(
            f"reseed must be one of {RESEED}, got {value!r}: 'worker' seeds each worker once "
            "(torch's behaviour), 'batch' reseeds before each batch, 'sample' before each sample"
        )
    return str(value)


def _mix(x: int) -> int:
    """splitmix64's finaliser: every input bit affects every output bit."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seed_for(base_seed: int, epoch: int, position: int, stream: int) -> int:
    return _mix(_mix(_mix((base_seed & _MASK64) ^ stream) ^ epoch) ^ position)


class Seedable(Protocol):
    """What a reseed seeds: a worker core's generators (its scope), or the process's."""

    def seed(self, seed: int) -> None: ...


@dataclass(frozen=True)
class Reseed:
    """How one task seeds: the mode, and where the task sits in the epoch."""

    mode: str  # "batch" or "sample"
    base_seed: int
    epoch: int
    seq: int  # the batch's position
    first_sample: int  # the position of its first sample
    generators: Seedable = GLOBAL_GENERATORS
    places: tuple[int, ...] = ()  # ranks sharding the epoch: each sample's place in it

    def before_batch(self, items: bool = False) -> None:
        """``items``: an iterable dataset, whose samples have no position of their own
        (it draws as it goes): seeded per batch in both modes."""
        if self.mode == "batch" or items:
            self.generators.seed(seed_for(self.base_seed, self.epoch, self.seq, _BATCH))

    def before_sample(self, offset: int) -> None:
        if self.mode == "sample":
            position = self.places[offset] if self.places else self.first_sample + offset
            self.generators.seed(seed_for(self.base_seed, self.epoch, position, _SAMPLE))

    def before_collate(self) -> None:
        if self.mode == "sample":
            position = self.places[0] if self.places else self.first_sample
            self.generators.seed(seed_for(self.base_seed, self.epoch, position, _COLLATE))


@contextlib.contextmanager
def kept_global_rngs(*, with_torch: bool = True) -> Iterator[None]:
    """Without workers the task runs in the training process: its reseeding must not
    change what the training loop draws afterwards. (Also around a worker's replay of the
    training loop's calls on the dataset, see conveyor._task.dataset_calls; a thread
    core's ``random`` and NumPy module draws are its own, torch's generator the process's:
    ``with_torch=False`` leaves that to the other threads.)"""
    py = random.getstate()
    npy = np.random.get_state()
    torch = sys.modules.get("torch") if with_torch else None
    own = torch.get_rng_state() if torch is not None else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        if torch is not None and own is not None:
            torch.set_rng_state(own)
