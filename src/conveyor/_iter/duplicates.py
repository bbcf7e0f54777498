"""Data seen several times over, without an error: two checks torch does not make.

* ``torch.distributed`` runs several ranks, but the loader's sampler does not
  shard: every rank trains on the whole dataset.
* An iterable dataset runs in several workers but does not shard: no worker asked
  ``get_worker_info()`` and their streams begin with the same batch, so every
  item comes once per worker.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from .. import _torch
from ..config import LoaderConfig, LoaderHistory


def unsharded_ranks(config: LoaderConfig) -> str | None:
    """The warning's text when several ranks would each see the whole dataset.

    Judged by what the loader will yield, never by the sampler alone: no warning when
    anything it draws from says it shards (a ``num_replicas`` > 1, as torch's
    ``DistributedSampler``; a ``num_processes`` > 1, as accelerate's ``BatchSamplerShard``,
    which shards at the batch sampler), nor when it yields no more than one rank's share
    of the dataset (ranks may then be disjoint, sharded in a way of their own)."""
    torch = _torch.load()
    if torch is None or config.iterable:  # an iterable dataset shards in its own code
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    ranks = dist.get_world_size()
    if ranks <= 1 or _declares_shards(config) or _one_share_or_less(config, ranks):
        return None
    draws = config.batch_sampler if config.batch_sampler is not None else config.sampler
    if draws is config.batch_sampler and type(draws).__name__ != "BatchSampler":
        what = f"batch sampler ({type(draws).__name__})"
    else:
        what = f"sampler ({type(config.sampler).__name__})"
    return (
        f"torch.distributed runs {ranks} ranks, but this DataLoader's {what} does not "
        f"shard the dataset: every rank will see every sample, {ranks} times per epoch "
        "in all. Fix: sampler=torch.utils.data.DistributedSampler(dataset) (and "
        "sampler.set_epoch(epoch) every epoch), or let your framework put one in. A "
        "sampler that shards in its own way can say so with a num_replicas attribute."
    )


_SHARD_COUNTS = ("num_replicas", "num_processes")  # torch's samplers; accelerate's shards
_INNER = ("batch_sampler", "sampler")  # what a (batch) sampler draws from


def _declares_shards(config: LoaderConfig) -> bool:
    """Whether the batch sampler, the sampler, the dataset or anything they draw from
    (a few levels down) says it takes one shard of several."""
    seen: set[int] = set()
    todo = [(obj, 0) for obj in (config.batch_sampler, config.sampler, config.dataset)]
    while todo:
        obj, depth = todo.pop()
        if obj is None or id(obj) in seen or depth > 4:
            continue
        seen.add(id(obj))
        for name in _SHARD_COUNTS:
            count = getattr(obj, name, None)
            if isinstance(count, int) and not isinstance(count, bool) and count > 1:
                return True
        todo += [(getattr(obj, name, None), depth + 1) for name in _INNER]
    return False


def _one_share_or_less(config: LoaderConfig, ranks: int) -> bool:
    """The loader yields no more than one rank's share of the dataset per epoch, so the
    ranks may be disjoint (False: it yields more, or cannot say)."""
    per_draw = 1
    if config.batch_sampler is not None:
        per_draw = getattr(config.batch_sampler, "batch_size", None) or config.batch_size or 0
    try:
        draws, samples = len(config.index_sampler), len(config.dataset)
    except TypeError:
        return False
    if not per_draw or not samples:
        return False
    return draws <= math.ceil(math.ceil(samples / per_draw) / ranks)


class StreamCheck:
    """Compares the first batch of each worker whose dataset never asked who it is; says
    so once per loader (``history.warned_duplicates``)."""

    def __init__(self, history: LoaderHistory) -> None:
        self._history = history
        self._first: dict[str, int] = {}  # fingerprint -> the worker that sent it

    @classmethod
    def wanted(cls, config: LoaderConfig, history: LoaderHistory) -> StreamCheck | None:
        """A check for an iterable dataset's workers, unless this loader warned already."""
        if config.iterable and config.num_workers > 1 and not history.warned_duplicates:
            return cls(history)
        return None

    def batch(self, worker_id: int, reply: Any, batch: Any) -> str | None:
        """The warning's text once two such workers began with the same batch (``reply``
        says whether its worker's dataset asked, with the epoch's first batch)."""
        if (
            getattr(reply, "asked_worker_info", None) is not False
            or self._history.warned_duplicates
        ):
            return None
        text = self.first_batch(worker_id, batch)
        if text is not None:
            self._history.warned_duplicates = True
        return text

    def first_batch(self, worker_id: int, batch: Any) -> str | None:
        """The warning's text once two workers began with the same batch."""
        mark = fingerprint(batch)
        other = self._first.setdefault(mark, worker_id)
        if other == worker_id:
            return None
        return (
            f"DataLoader workers {other} and {worker_id} began this epoch with the same "
            "batch, and the iterable dataset never called get_worker_info(): each worker "
            "is iterating over the whole dataset, so every item is delivered once per "
            "worker. Fix: in __iter__, take info = torch.utils.data.get_worker_info() (or "
            "conveyor's) and yield only this worker's share, e.g. "
            "itertools.islice(items, info.id, None, info.num_workers)."
        )


def fingerprint(batch: Any) -> str:
    """A digest of a batch's values (arrays and tensors by their bytes)."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(value: Any) -> None:
        if hasattr(value, "numpy") and hasattr(value, "dtype"):  # a tensor
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            digest.update(f"{value.dtype}{value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, dict):
            for key in value:
                digest.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"{type(value).__name__}{len(value)}".encode())
            for item in value:
                feed(item)
        else:
            digest.update(repr(value).encode())

    feed(batch)
    return digest.hexdigest()
