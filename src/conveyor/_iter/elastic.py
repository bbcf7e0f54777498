"""A checkpoint's ``ranks`` part: where the whole epoch stands, across ranks.

A rank whose loader shards the epoch (:mod:`.sharding`) writes, beside its own
position, what a run on any number of ranks needs to deal the rest of the epoch::

    {"dealing": "samples"|"batches", "world_size": W, "rank": r, "batch_size": b,
     "drop_last": ..., "pad": ..., "batch_drop_last": ...,
     "order": {"sampler": ..., "length": N, "seed": ..., "shuffle": ..., "epoch": e},
     "base": {"prefix": G, "extra": [...]},   # places delivered before this run's part
     "samples": c, "beyond": [j, ...]}         # this rank's local samples delivered

Ranks move in lockstep, so one rank's part says what every rank delivered (the case of
Lightning and accelerate, which save one rank's state); :func:`merge_states` unites
every rank's exact part instead (ranks that did not deliver alike, ``in_order=False``).
:func:`resumed_epoch` turns a part into the rest of the epoch, dealt to a new rank.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import StateError
from .sharding import BATCHES, SAMPLES, Deal, Delivered, Sharding, covered, reseed_places

RANKS = "ranks"
_OWN = "conveyor"


@dataclass(frozen=True)
class RankPart:
    """A ``ranks`` part, read and checked."""

    deal: Deal
    order: dict[str, Any]
    base: Delivered
    samples: int
    beyond: tuple[int, ...] = ()

    def delivered(self, rest: Sequence[int], length: int) -> Delivered:
        """The places delivered, every rank taken to have delivered what this one did."""
        ranks = self.deal.world_size
        prefix, extra = covered(self.deal, [self.samples] * ranks, [self.beyond] * ranks)
        stream = self.deal.stream(rest, length)
        return self.base.plus(rest, length, min(prefix, len(stream)), extra)


def write_part(
    sharding: Sharding, order: dict[str, Any], base: Delivered, samples: int, beyond: Sequence[int]
) -> dict[str, Any]:
    deal = sharding.deal
    return {
        "dealing": deal.dealing,
        "world_size": deal.world_size,
        "rank": deal.rank,
        "batch_size": deal.batch_size,
        "drop_last": deal.drop_last,
        "pad": deal.pad,
        "batch_drop_last": deal.batch_drop_last,
        "order": dict(order),
        "base": {"prefix": base.prefix, "extra": sorted(base.extra)},
        "samples": samples,
        "beyond": sorted(beyond),
    }


def read_part(raw: Any, where: str = "state['conveyor']['ranks']") -> RankPart:
    """A ``ranks`` part; a StateError names the first key that is missing or wrong."""
    if not isinstance(raw, dict):
        raise StateError(f"{where} should be a dict, got {type(raw).__name__}")
    dealing = raw.get("dealing")
    if dealing not in (SAMPLES, BATCHES):
        raise StateError(f"{where}['dealing'] should be 'samples' or 'batches', got {dealing!r}")
    ints = {k: _count(raw, k, where) for k in ("world_size", "rank", "batch_size", "samples")}
    if not 0 <= ints["rank"] < ints["world_size"] or ints["batch_size"] < 1:
        raise StateError(
            f"{where}: rank {ints['rank']} of world_size {ints['world_size']} with batch_size "
            f"{ints['batch_size']} is no rank of a run"
        )
    order, base = raw.get("order"), raw.get("base")
    if not isinstance(order, dict) or not isinstance(order.get("length"), int):
        raise StateError(f"{where}['order'] should be a dict with the order's 'length'")
    if not isinstance(base, dict):
        raise StateError(f"{where}['base'] should be a dict with 'prefix' and 'extra'")
    deal = Deal(
        dealing,
        ints["world_size"],
        ints["rank"],
        ints["batch_size"],
        bool(raw.get("drop_last")),
        pad=bool(raw.get("pad", True)),
        batch_drop_last=bool(raw.get("batch_drop_last")),
    )
    delivered = Delivered(
        _count(base, "prefix", f"{where}['base']"), frozenset(_ints(base, "extra", where))
    )
    return RankPart(deal, order, delivered, ints["samples"], tuple(_ints(raw, "beyond", where)))


def _count(d: dict[str, Any], key: str, where: str) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(f"{where}['{key}'] should be a count >= 0, got {value!r}")
    return value


def _ints(d: dict[str, Any], key: str, where: str) -> list[int]:
    value = d.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise StateError(f"{where}['{key}'] should be a list of ints, got {value!r:.80}")
    return value


# --- resuming -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumedEpoch:
    """The rest of an epoch as this rank takes it: batches of dataset indices, and each
    sample's place (for ``reseed="sample"``)."""

    base: Delivered  # delivered before this run took over the epoch
    batches: list[list[int]]
    places: list[tuple[int, ...]]


def check_fits(part: RankPart, sharding: Sharding | None, what: str) -> None:
    """A StateError unless a loader dealing as ``sharding`` can continue ``part``'s epoch
    (``what`` says what the loader samples with, for the message)."""
    deal = part.deal
    taken = f"rank {deal.rank} of {deal.world_size}"
    if sharding is None:
        raise StateError(
            f"This state was taken by {taken}, whose loader dealt the epoch with "
            f"{part.order.get('sampler')}; this loader's sampler ({what}) does not shard, so "
            "it cannot continue that epoch. Fix: build the loader the way the run did, with a "
            "DistributedSampler (conveyor.DistributedSampler also runs on one process, "
            "without a process group)."
        )
    if sharding.deal.dealing != deal.dealing:
        raise StateError(
            f"This state was taken by {taken}, dealing {deal.dealing} to ranks; this loader "
            f"deals {sharding.deal.dealing} ({what}). Build the loader the way the run did."
        )
    mine = sharding.identity()
    for key, saved in part.order.items():
        if key == "epoch":
            continue  # the state's epoch wins: the sampler's may not be set yet
        if key in mine and mine[key] != saved:
            raise StateError(
                f"This state was taken by {taken} with an epoch order of {key}={saved!r}; "
                f"this loader's sampler has {key}={mine[key]!r}, so it would deal another "
                f"order and deliver some samples twice and others never. Fix: build the "
                f"sampler with {key}={saved!r}, as the run did."
            )


def resumed_epoch(part: RankPart, sharding: Sharding, order: Sequence[int]) -> ResumedEpoch:
    """Deal what ``part``'s epoch has left to the rank ``sharding`` says this is."""
    length = len(order)
    delivered = part.delivered(part.base.rest(length), length)
    return dealt(sharding.deal, delivered, order)


def dealt(deal: Deal, base: Delivered, order: Sequence[int]) -> ResumedEpoch:
    length = len(order)
    rest = base.rest(length)
    stream = deal.stream(rest, length)
    batches, places = [], []
    for indices in deal.batches(stream):
        batches.append([order[stream[i]] for i in indices])
        places.append(reseed_places(rest, indices, length))
    return ResumedEpoch(base, batches, places)


# --- many ranks' states, merged -----------------------------------------------------------


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state for every rank of a new run, from all old ranks' states.

    Each old rank's exact progress counts (ranks that delivered different numbers of
    samples, or out of order), and the skipped samples of every rank travel. A StateError
    names the ranks that do not belong together: another epoch or epoch order, a rank
    missing or given twice, or a state taken without a sharding sampler.
    """
    if not states:
        raise StateError("merge_states needs the states of every rank, got none")
    parts = [_ranks_part(state, i) for i, state in enumerate(states)]
    first = parts[0]
    world = first.deal.world_size
    by_rank: dict[int, int] = {}
    for i, part in enumerate(parts):
        if part.deal.rank in by_rank:
            raise StateError(
                f"merge_states: states {by_rank[part.deal.rank]} and {i} are both rank "
                f"{part.deal.rank}'s; give each rank's state once"
            )
        by_rank[part.deal.rank] = i
        _check_together(first, part, states[0], states[i], 0, i)
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        raise StateError(
            f"merge_states: the run had {world} ranks, and the states of ranks {missing} are "
            "missing; merge every rank's state (or load one rank's state alone)"
        )
    finished = {bool(s.get("_iterator_finished")) for s in states}
    merged = copy.deepcopy(states[by_rank[0]])
    own = merged[_OWN]
    own["skipped"] = _all_skipped(states)
    if finished == {True}:
        return merged
    if len(finished) > 1:
        ended = [
            p.deal.rank for p, s in zip(parts, states, strict=True) if s.get("_iterator_finished")
        ]
        raise StateError(
            f"merge_states: ranks {ended} had ended the epoch and the others had not: states "
            "of one training step belong together; take them at the same step on every rank"
        )
    length = int(first.order["length"])
    rest = first.base.rest(length)
    ordered = [parts[by_rank[r]] for r in range(world)]
    prefix, extra = covered(first.deal, [p.samples for p in ordered], [p.beyond for p in ordered])
    stream = first.deal.stream(rest, length)
    union = first.base.plus(rest, length, min(prefix, len(stream)), extra)
    own[RANKS] = {**own[RANKS], "base": {"prefix": union.prefix, "extra": sorted(union.extra)}}
    own[RANKS].update(samples=0, beyond=[])
    return merged


def _ranks_part(state: Any, i: int) -> RankPart:
    own = state.get(_OWN) if isinstance(state, dict) else None
    if not isinstance(own, dict) or RANKS not in own:
        raise StateError(
            f"merge_states: state {i} has no ranks part: it was not taken by conveyor's loader "
            "with a DistributedSampler (or accelerate's sharding), so it says nothing of the "
            "other ranks' share"
        )
    return read_part(own[RANKS], f"states[{i}]['conveyor']['ranks']")


def _check_together(
    first: RankPart, part: RankPart, a: dict[str, Any], b: dict[str, Any], i: int, j: int
) -> None:
    pairs = {
        "epoch": (a[_OWN].get("epoch"), b[_OWN].get("epoch")),
        "epoch order": (first.order, part.order),
        "world_size": (first.deal.world_size, part.deal.world_size),
        "dealing": (first.deal.dealing, part.deal.dealing),
        "batch_size": (first.deal.batch_size, part.deal.batch_size),
        "delivered before the run": (first.base, part.base),
    }
    for what, (mine, theirs) in pairs.items():
        if mine != theirs:
            raise StateError(
                f"merge_states: states {i} (rank {first.deal.rank}) and {j} (rank "
                f"{part.deal.rank}) differ in {what}: {mine!r:.80} and {theirs!r:.80}. They "
                "are not the states of one training step of one run."
            )


def _all_skipped(states: Sequence[dict[str, Any]]) -> list[Any]:
    seen: dict[str, Any] = {}
    for state in states:
        for record in state[_OWN].get("skipped") or []:
            key = repr((record.get("index"), record.get("epoch"), record.get("stage")))
            seen.setdefault(key, record)
    return list(seen.values())
