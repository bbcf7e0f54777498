"""Data-parallel runs simulated in one process: one loader per rank, stepped in lockstep
(each step takes one batch from every rank, as a data-parallel training step does), so
the tests of resuming on another number of ranks need no process group. Real ranks
(gloo, one process each) are in tests/distributed."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor import DataLoader, DistributedSampler, merge_states

Step = list[list[int]]  # one batch of sample ids per rank


class Ids:
    """Sample ``i`` is ``i``: batches are the ids of their samples."""

    def __init__(self, n: int, fail_at: int = -1) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.fail_at:
            raise ValueError(f"sample {i} is corrupt")
        return i


@dataclass
class World:
    """How each rank builds its loader: ``world_size`` ranks of ``batch_size``."""

    world_size: int
    batch_size: int
    n: int = 103
    shuffle: bool = True
    drop_last: bool = False
    seed: int = 7
    epoch: int = 1  # the sampler's epoch, set as a training loop sets it
    options: dict[str, Any] = field(default_factory=dict)
    dataset: Callable[[], Any] | None = None
    sampler_class: Any = DistributedSampler

    def loader(self, rank: int, epoch: int | None = None) -> DataLoader:
        dataset = self.dataset() if self.dataset is not None else Ids(self.n)
        sampler = self.sampler_class(
            dataset, num_replicas=self.world_size, rank=rank, shuffle=self.shuffle,
            seed=self.seed, drop_last=self.drop_last,
        )  # fmt: skip
        sampler.set_epoch(self.epoch if epoch is None else epoch)
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, **self.options)

    def loaders(self, epoch: int | None = None) -> list[DataLoader]:
        return [self.loader(rank, epoch) for rank in range(self.world_size)]


def ids(batch: Any) -> list[int]:
    return [int(i) for i in (batch.tolist() if hasattr(batch, "tolist") else batch)]


def lockstep(iterators: Sequence[Any], steps: int | None = None) -> list[Step]:
    """Up to ``steps`` steps (all, by default); every rank ends on the same step."""
    taken: list[Step] = []
    while steps is None or len(taken) < steps:
        batches = [next(it, None) for it in iterators]
        ended = [b is None for b in batches]
        assert all(ended) or not any(ended), f"ranks ended apart: {ended}"
        if ended[0]:
            break
        taken.append([ids(b) for b in batches])
    return taken


def checkpoint(loaders: Sequence[DataLoader]) -> list[dict[str, Any]]:
    """Every rank's state, through JSON as a checkpoint file would carry it."""
    return [json.loads(json.dumps(loader.state_dict())) for loader in loaders]


@dataclass
class Resumed:
    before: list[Step]  # the old run's steps up to its checkpoint
    after: list[Step]  # the new run's rest of that epoch
    next_epoch: list[Step]  # the new run's following epoch
    loaders: list[DataLoader]

    def delivered(self) -> collections.Counter[int]:
        return collections.Counter(i for step in self.before + self.after for b in step for i in b)


def resume(
    old: World, new: World, steps: int, *, state_of: int | str = 0, set_epoch_late: bool = False
) -> Resumed:
    """Run ``old`` for ``steps`` steps, checkpoint, and finish the epoch on ``new`` from
    rank ``state_of``'s state (or ``"merged"``: all ranks' states merged), then run its
    next epoch. ``set_epoch_late``: the new run sets its samplers' epoch after ``iter()``,
    as Lightning does."""
    loaders = old.loaders()
    before = lockstep([iter(loader) for loader in loaders], steps)
    states = checkpoint(loaders)
    state = merge_states(states) if state_of == "merged" else states[int(state_of)]
    resumed = new.loaders(epoch=0 if set_epoch_late else None)
    for loader in resumed:
        loader.load_state_dict(state)
    iterators = [iter(loader) for loader in resumed]
    if set_epoch_late:
        for loader in resumed:
            loader.batch_sampler.sampler.set_epoch(new.epoch)
    after = lockstep(iterators)
    for loader in resumed:
        loader.batch_sampler.sampler.set_epoch(new.epoch + 1)
    following = lockstep([iter(loader) for loader in resumed])
    return Resumed(before, after, following, resumed)


def uninterrupted(world: World, epoch: int | None = None) -> list[Step]:
    return lockstep([iter(loader) for loader in world.loaders(epoch)])


def exactly_once(run: Resumed, n: int, repeats_allowed: int, missing_allowed: int = 0) -> None:
    """Every sample delivered once over both runs, but at most ``repeats_allowed``
    repeats (padding) and ``missing_allowed`` left out (drop_last)."""
    seen = run.delivered()
    missing = [i for i in range(n) if seen[i] == 0]
    repeats = sum(count - 1 for count in seen.values() if count > 1)
    assert len(missing) <= missing_allowed, f"never delivered: {missing}"
    assert repeats <= repeats_allowed, f"{repeats} repeats: {sorted(seen.items())}"
    assert set(seen) <= set(range(n))
