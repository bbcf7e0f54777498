"""How ranks cut their batches from one epoch order, so a checkpoint can say where the
whole epoch stands and a resumed run can deal the rest to another number of ranks.

Every rank of a data-parallel run draws the same *epoch order* (a list of dataset
indices; a sample's *place* is its position in it) and takes its share of a *stream*:
the places not yet delivered, padded with the order's first places up to a multiple of
what the ranks take per round. Two ways of dealing the stream are recognised:

* ``SAMPLES``: a ``DistributedSampler`` (torch's or conveyor's). Rank ``r`` of ``W``
  takes stream indices ``r, r+W, r+2W, ...`` and batches them ``b`` at a time.
* ``BATCHES``: accelerate's ``BatchSamplerShard`` (``split_batches=False``). The stream
  is cut into batches of ``b``; batch ``i`` goes to rank ``i % W``; ``even_batches``
  pads the last round.

For an uninterrupted epoch the stream is the whole order and these are exactly torch's
and accelerate's shares. Ranks move in lockstep (a data-parallel step takes one batch on
every rank), so when each rank has delivered its first ``c`` samples, the stream's first
``W*c`` indices are delivered: a prefix, whatever ``W`` was. Everything here is
arithmetic on lists of ints; nothing draws, imports a framework or touches a sampler
but :func:`find`, which only reads attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _torch
from ..distributed import DistributedSampler, epoch_order
from ..sampling._defaults import plain_batches

SAMPLES, BATCHES = "samples", "batches"


@dataclass(frozen=True)
class Deal:
    """How one rank takes its share of a stream of places."""

    dealing: str  # SAMPLES or BATCHES
    world_size: int
    rank: int
    batch_size: int  # samples per batch on each rank
    drop_last: bool  # SAMPLES: the sampler's (cut the stream); BATCHES: the batch sampler's
    pad: bool = True  # BATCHES: accelerate's even_batches
    batch_drop_last: bool = False  # SAMPLES: the batch sampler's (drops a short last batch)

    @property
    def round_size(self) -> int:
        """Stream indices one round of batches takes over all ranks, padded to a multiple."""
        return self.world_size * (self.batch_size if self.dealing == BATCHES else 1)

    def stream_index(self, j: int, rank: int | None = None) -> int:
        """Where ``rank``'s (this rank's) local sample ``j`` sits in the stream."""
        r = self.rank if rank is None else rank
        if self.dealing == SAMPLES:
            return r + self.world_size * j
        b = self.batch_size
        return (r + self.world_size * (j // b)) * b + j % b

    def head(self, length: int) -> range:
        """The places padding repeats, cycled: torch's sampler pads with the order's first
        indices, accelerate with its first round's."""
        return range(min(self.round_size, length) if self.dealing == BATCHES else length)

    def stream(self, rest: Sequence[int], length: int) -> list[int]:
        """The places to deal: ``rest``, padded from :meth:`head` or cut to whole rounds
        (``length``: places in the epoch order)."""
        size, multiple, head = len(rest), self.round_size, self.head(length)
        if self.dealing == SAMPLES and self.drop_last:
            return list(rest[: size - size % multiple])
        if self.dealing == BATCHES and self.drop_last:
            whole = size - size % self.batch_size  # the batch sampler drops a short batch
            return list(rest[: whole - whole % multiple])
        missing = -size % multiple if (self.pad or self.dealing == SAMPLES) else 0
        if missing == 0 or not head:
            return list(rest)
        cycled = list(head) * (missing // len(head) + 1)
        return [*rest, *cycled[:missing]]

    def batches(self, stream: Sequence[int]) -> list[tuple[int, ...]]:
        """This rank's batches, as stream indices."""
        b, size = self.batch_size, len(stream)
        if self.dealing == BATCHES:
            starts = range(self.rank * b, size, self.round_size)
            return [tuple(range(s, min(s + b, size))) for s in starts]
        mine = range(self.rank, size, self.world_size)
        cut = [tuple(mine[k : k + b]) for k in range(0, len(mine), b)]
        if cut and self.batch_drop_last and len(cut[-1]) < b:
            cut.pop()
        return cut

    def local_length(self, stream_size: int) -> int:
        """Samples this rank takes from a stream of ``stream_size`` (its last batch may be
        shorter)."""
        return sum(len(batch) for batch in self.batches(range(stream_size)))


@dataclass(frozen=True)
class Delivered:
    """Places of the epoch order delivered, on all ranks together: every place below
    ``prefix``, and ``extra`` above it."""

    prefix: int = 0
    extra: frozenset[int] = frozenset()

    def rest(self, length: int) -> list[int]:
        """The places still to deliver, ascending."""
        extra = self.extra
        return [p for p in range(self.prefix, length) if p not in extra]

    def plus(
        self, rest: Sequence[int], length: int, prefix: int, extra: Iterable[int]
    ) -> Delivered:
        """These places and, of ``rest`` (see :meth:`rest`), its first ``prefix`` and those
        at ``extra`` (indices into ``rest``; padding beyond it is no place of its own).
        Every place below ``rest[prefix]`` is then delivered: it was, or it is in ``rest``
        before ``prefix``."""
        size = len(rest)
        edge = rest[prefix] if prefix < size else length
        more = {rest[i] for i in extra if prefix <= i < size}
        return Delivered(edge, frozenset(p for p in (*self.extra, *more) if p >= edge))


def covered(
    deal: Deal, counts: Sequence[int], beyond: Sequence[Iterable[int]]
) -> tuple[int, set[int]]:
    """Stream indices delivered when rank ``r`` delivered its local samples below
    ``counts[r]`` and at ``beyond[r]``: a prefix every rank covers, and the rest one by
    one."""
    low = min(counts)
    if deal.dealing == BATCHES:
        low -= low % deal.batch_size  # whole rounds only: a short batch is a rank's own
    prefix = deal.world_size * low
    extra = set()
    for rank, (count, more) in enumerate(zip(counts, beyond, strict=True)):
        for j in (*range(low, count), *more):
            extra.add(deal.stream_index(j, rank))
    return prefix, extra


def reseed_places(
    rest: Sequence[int], stream_indices: Iterable[int], length: int
) -> tuple[int, ...]:
    """What ``reseed="sample"`` seeds each sample with: its place in the epoch order, the
    same on any number of ranks; padding (a place repeated) gets one past every place."""
    size = len(rest)
    return tuple(rest[i] if i < size else length + i for i in stream_indices)


# --- recognising a loader's sharding -------------------------------------------------------


@dataclass(frozen=True)
class Sharding:
    """A loader's way of dealing (``deal``) and where its epoch order comes from."""

    deal: Deal
    order_source: Any  # the distributed sampler, or the inner sampler accelerate batches
    length: int  # places in the epoch order

    def identity(self) -> dict[str, Any]:
        """What the epoch order depends on (besides generator states, saved elsewhere):
        a state resumes only into a loader that draws the same order."""
        source = self.order_source
        kind = f"{type(source).__module__}.{type(source).__qualname__}"
        found: dict[str, Any] = {"sampler": kind, "length": self.length}
        for name in ("seed", "shuffle", "epoch"):
            value = getattr(source, name, None)
            if isinstance(value, (bool, int)):
                found[name] = value
        return found

    def order(self, identity: dict[str, Any]) -> list[int]:
        """The epoch order ``identity`` names (a DistributedSampler's permutation of its
        seed and that epoch; accelerate's: the inner sampler, drawn now, after the caller
        put its generators where the epoch began)."""
        if self.deal.dealing == SAMPLES:
            shuffle, seed = bool(identity.get("shuffle")), int(identity.get("seed", 0))
            return epoch_order(self.length, shuffle, seed, int(identity.get("epoch", 0)))
        source = self.order_source
        if "epoch" in identity and callable(getattr(source, "set_epoch", None)):
            source.set_epoch(identity["epoch"])
        return [int(i) for i in source]


def find(config: Any) -> Sharding | None:
    """How ``config``'s loader shards its batches across ranks, if it is a way
    :mod:`this module <.sharding>` knows; None for any other sampler."""
    batch_sampler = config.batch_sampler
    if config.iterable or batch_sampler is None:
        return None
    shard = _accelerate_shard(batch_sampler)
    if shard is not None:
        return shard
    sampler: Any = getattr(batch_sampler, "sampler", None)
    if not (plain_batches(batch_sampler) and _distributed(sampler)):
        return None
    deal = Deal(
        SAMPLES,
        int(sampler.num_replicas),
        int(sampler.rank),
        int(batch_sampler.batch_size),
        bool(sampler.drop_last),
        batch_drop_last=bool(batch_sampler.drop_last),
    )
    return Sharding(deal, sampler, len(sampler.dataset))


def _distributed(sampler: Any) -> bool:
    """conveyor's or torch's own ``DistributedSampler``: the order is theirs, known."""
    torch = _torch.load()
    if type(sampler) is DistributedSampler:
        return True
    return torch is not None and type(sampler) is torch.utils.data.DistributedSampler


def _accelerate_shard(batch_sampler: Any) -> Sharding | None:
    kind = type(batch_sampler)
    if kind.__name__ != "BatchSamplerShard" or not kind.__module__.startswith("accelerate"):
        return None
    inner: Any = getattr(batch_sampler, "batch_sampler", None)
    if batch_sampler.split_batches or not plain_batches(inner) or inner.batch_size is None:
        return None
    source = inner.sampler
    deal = Deal(
        BATCHES,
        int(batch_sampler.num_processes),
        int(batch_sampler.process_index),
        int(inner.batch_size),
        bool(inner.drop_last),
        pad=bool(batch_sampler.even_batches),
    )
    return Sharding(deal, source, len(source))
