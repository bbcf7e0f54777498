"""This rank's share of the epoch it is in: what a state needs to say where the whole
epoch stands, and the place of each sample (``reseed="sample"`` seeds by it).

A fresh epoch's share is the sharding sampler's own; a resumed one is the rest of the
old run's epoch dealt to this rank (:func:`.elastic.resumed_epoch`), whose batches the
cursor draws instead of the sampler's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .elastic import RankPart, ResumedEpoch, resumed_epoch, write_part
from .sharding import Delivered, Sharding


class EpochShare:
    def __init__(self, sharding: Sharding) -> None:
        self.sharding = sharding
        self.order: dict[str, Any] | None = None  # what the epoch order was drawn from
        self._base = Delivered()
        self._resumed: ResumedEpoch | None = None
        # A resumed epoch's batches continue the old rank's positions (its batch count and
        # sample count at the state), so that reseed="batch" and a run on the same ranks
        # go on as the uninterrupted run would.
        self._first_seq = self._first_sample = 0

    def fresh(self) -> None:
        """A new epoch: the sampler deals all of it (its order known at the first draw)."""
        self.order, self._base, self._resumed = None, Delivered(), None
        self._first_seq = self._first_sample = 0

    def first_draw(self) -> None:
        if self.order is None:
            self.order = self.sharding.identity()

    def resume(self, part: RankPart, first_seq: int, first_sample: int) -> list[list[int]]:
        """Continue ``part``'s epoch: the batches this rank takes of what is left (drawn
        after the generators are back where that epoch began), the first of them at
        position ``first_seq``, its first sample at ``first_sample``."""
        order = self.sharding.order(part.order)
        self._resumed = resumed = resumed_epoch(part, self.sharding, order)
        self.order, self._base = dict(part.order), resumed.base
        self._first_seq, self._first_sample = first_seq, first_sample
        return resumed.batches

    def places(self, seq: int, first: int, count: int) -> tuple[int, ...]:
        """The places of batch ``seq``'s samples (local positions ``first``...)."""
        if self._resumed is not None:
            return self._resumed.places[seq - self._first_seq]
        deal, length = self.sharding.deal, self.sharding.length
        indices = (deal.stream_index(j) for j in range(first, first + count))
        return tuple(i if i < length else length + i for i in indices)

    def part(self, samples: int, beyond: Sequence[int]) -> dict[str, Any]:
        """The state's ``ranks`` part, this rank having delivered its local samples below
        ``samples`` and at ``beyond``."""
        self.first_draw()
        assert self.order is not None
        skip = self._first_sample
        mine = [j - skip for j in beyond if j >= skip]
        return write_part(self.sharding, self.order, self._base, max(samples - skip, 0), mine)
