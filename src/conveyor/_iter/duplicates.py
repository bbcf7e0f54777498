"""Data seen several times over, without an error: two checks torch does not make.

* ``torch.distributed`` runs several ranks, but the loader's sampler does not
  shard: every rank trains on the whole dataset.
* An iterable dataset runs in several workers but does not shard: no worker asked
  ``get_worker_info()`` and their streams begin with the same batch, so every
  item comes once per worker.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from .. import _torch
from ..config import LoaderConfig, LoaderHistory


def unsharded_ranks(config: LoaderConfig) -> str | None:
    """The warning's text when several ranks would each see the whole dataset."""
    torch = _torch.load()
    if torch is None or config.iterable:  # an iterable dataset shards in its own code
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    ranks = dist.get_world_size()
    if ranks <= 1:
        return None
    samplers = (
        config.sampler,
        config.batch_sampler,
        getattr(config.batch_sampler, "sampler", None),
    )
    if any(_shards(s) for s in samplers):
        return None
    return (
        f"torch.distributed runs {ranks} ranks, but this DataLoader's sampler "
        f"({type(config.sampler).__name__}) does not shard the dataset: every rank will see "
        f"every sample, {ranks} times per epoch in all. Fix: "
        "sampler=torch.utils.data.DistributedSampler(dataset) (and sampler.set_epoch(epoch) "
        "every epoch), or let your framework put one in. A sampler that shards in its own "
        "way can say so with a num_replicas attribute."
    )


def _shards(sampler: Any) -> bool:
    replicas = getattr(sampler, "num_replicas", None)
    return isinstance(replicas, int) and replicas > 1


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
