"""``DistributedSampler``: each rank's share of the epoch, as torch's, on any number of ranks.

torch 2.13's signature, defaults and indices for an uninterrupted run: the epoch's order
is a permutation of the dataset drawn from ``seed + epoch`` (or ``0..n-1`` without
``shuffle``), padded with its own first indices to a multiple of the world size (or cut
to one, ``drop_last=True``), and rank ``r`` takes every ``num_replicas``-th index from
``r``. With torch installed it is a ``torch.utils.data.DistributedSampler`` (Lightning
and accelerate recognise it) and draws with torch's generator; without torch it draws
with NumPy.

What conveyor's loader adds to this sampler, and to torch's own class alike, is a
checkpoint that says where the whole epoch stands, so a run resumes on another number
of ranks (see ``conveyor._iter.sharding`` and docs/guide.md). One difference from torch:
with no process group and no ``WORLD_SIZE`` in the environment, the world is this one
process (torch raises), so a single-process run, a debugger or a resume on one machine
needs no ``init_process_group``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from . import _torch

__all__ = ["DistributedSampler", "world"]

torch: Any = _torch.load()
_BASES: tuple[type, ...] = (torch.utils.data.DistributedSampler,) if torch is not None else ()


def process_group() -> tuple[int, int] | None:
    """``(world size, rank)`` of torch's default process group; None when there is none."""
    if torch is not None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size()), int(dist.get_rank())
    return None


def world() -> tuple[int, int]:
    """``(world size, rank)`` of the default process group; ``(1, 0)`` when there is none
    and the environment does not say this process is one of several."""
    if (group := process_group()) is not None:
        return group
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size > 1:
        raise RuntimeError(
            f"WORLD_SIZE={size} says this process is one of {size} ranks, but no process "
            "group is initialized, so this sampler cannot tell which share is this rank's. "
            "Fix: call torch.distributed.init_process_group() before building the sampler, "
            "or pass num_replicas= and rank= yourself."
        )
    return 1, 0


class DistributedSampler(*_BASES):  # type: ignore[misc]
    """Yields rank ``rank``'s share of each epoch's order (call ``set_epoch(e)`` each epoch,
    as with torch's sampler, or the order repeats)."""

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None or rank is None:
            size, own = world()
            num_replicas = size if num_replicas is None else num_replicas
            rank = own if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(len(self.dataset), self.shuffle, self.seed, self.epoch)
        if self.drop_last:
            order = order[: self.total_size]
        elif (padding := self.total_size - len(order)) > 0:
            order += (order * math.ceil(padding / len(order)))[:padding]
        return iter(order[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return int(self.num_samples)

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next ``iter()`` yields (each epoch its own order)."""
        self.epoch = epoch


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The whole epoch's order before it is padded and dealt: torch's permutation of
    ``seed + epoch`` (NumPy's without torch), or ``0..n-1``."""
    if not shuffle:
        return list(range(n))
    if torch is not None:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        order: list[int] = torch.randperm(n, generator=generator).tolist()
        return order
    return [int(i) for i in np.random.default_rng(seed + epoch).permutation(n)]
