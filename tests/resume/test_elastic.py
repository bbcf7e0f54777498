"""Resuming on another number of ranks: every sample of the epoch exactly once over both
runs, whatever the world size, batch size or worker count, from one rank's state or from
all ranks' states merged (conveyor.merge_states).

Ranks are simulated in one process (tests/resume/ranks.py: one loader per rank, stepped
in lockstep); tests/distributed runs the same with real gloo ranks.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from conveyor import DataLoader, DistributedSampler, StateError, merge_states

from .ranks import Ids, World, checkpoint, exactly_once, ids, lockstep, resume, uninterrupted

CHANGES = {  # (old world, old batch) -> (new world, new batch)
    "4x4 to 2x4": ((4, 4), (2, 4)),
    "2x4 to 3x4": ((2, 4), (3, 4)),
    "3x5 to 1x5": ((3, 5), (1, 5)),
    "4x4 to 4x4": ((4, 4), (4, 4)),
    "2x6 to 3x4": ((2, 6), (3, 4)),
    "4x2 to 2x5": ((4, 2), (2, 5)),
}


def _worlds(change: str, **kwargs: Any) -> tuple[World, World]:
    (w, b), (w2, b2) = CHANGES[change]
    return World(w, b, **kwargs), World(w2, b2, **kwargs)


@pytest.mark.parametrize("state_of", [0, "last", "merged"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("change", CHANGES)
def test_every_sample_once_over_both_runs(
    change: str, shuffle: bool, drop_last: bool, state_of: Any
) -> None:
    old, new = _worlds(change, shuffle=shuffle, drop_last=drop_last)
    which = old.world_size - 1 if state_of == "last" else state_of
    run = resume(old, new, steps=3, state_of=which)
    # drop_last=False: the new world pads its last round (at most W'-1 repeats);
    # drop_last=True: it leaves out what does not fill one (at most W'-1 samples).
    w2 = new.world_size
    exactly_once(run, old.n, repeats_allowed=0 if drop_last else w2 - 1,
                 missing_allowed=w2 - 1 if drop_last else 0)  # fmt: skip
    assert run.next_epoch == uninterrupted(new, epoch=new.epoch + 1)


@pytest.mark.parametrize("change", ["4x4 to 4x4", "2x6 to 3x4", "4x2 to 2x4"])
def test_the_same_global_batch_gives_the_uninterrupted_steps(change: str) -> None:
    """W*b = W'*b': the union of the ranks' batches at each step is the uninterrupted
    run's, step for step (and with the same world, each rank's batch is)."""
    pairs = {**CHANGES, "4x2 to 2x4": ((4, 2), (2, 4))}
    (w, b), (w2, b2) = pairs[change]
    old, new = World(w, b, n=96), World(w2, b2, n=96)
    run = resume(old, new, steps=2)
    steps = uninterrupted(old)
    assert run.before == steps[:2]
    union = [sorted(i for batch in step for i in batch) for step in run.after]
    assert union == [sorted(i for batch in step for i in batch) for step in steps[2:]]
    if (w, b) == (w2, b2):
        assert run.after == steps[2:]


def test_a_state_of_the_same_world_continues_exactly_with_padding() -> None:
    """103 samples on 4 ranks: torch's sampler pads one; the resumed run pads alike."""
    old = World(4, 4, n=103)
    run = resume(old, World(4, 4, n=103), steps=3)
    assert run.before + run.after == uninterrupted(old)


def test_the_states_epoch_wins_over_a_sampler_set_after_iter() -> None:
    """Lightning calls iter() before set_epoch() (and injects torch's sampler): the
    resumed epoch is the state's, not the one the sampler was left at."""
    torch_sampler = pytest.importorskip("torch.utils.data").DistributedSampler
    old = World(4, 4, n=100, epoch=1, sampler_class=torch_sampler)
    new = World(4, 4, n=100, epoch=1, sampler_class=torch_sampler)
    run = resume(old, new, steps=3, set_epoch_late=True)
    exactly_once(run, 100, repeats_allowed=0)
    assert run.before + run.after == uninterrupted(old)


def test_after_a_finished_epoch_the_next_one_is_dealt_even_if_set_epoch_comes_late() -> None:
    """A state taken at the epoch's end, loaded by Lightning (iter() before set_epoch()):
    the next epoch is the state's epoch + 1, not the order of the sampler's epoch 0."""
    torch_sampler = pytest.importorskip("torch.utils.data").DistributedSampler
    old = World(2, 4, n=40, epoch=1, sampler_class=torch_sampler, options={"num_workers": 2})
    loaders = old.loaders()
    lockstep([iter(loader) for loader in loaders])
    states = checkpoint(loaders)
    new = World(2, 4, n=40, epoch=2, sampler_class=torch_sampler, options={"num_workers": 2})
    resumed = new.loaders(epoch=0)
    for loader, state in zip(resumed, states, strict=True):
        loader.load_state_dict(state)
    iterators = [iter(loader) for loader in resumed]
    for loader in resumed:
        loader.batch_sampler.sampler.set_epoch(2)
    assert lockstep(iterators) == uninterrupted(new)


@pytest.mark.parametrize(
    "workers", [{"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}]
)
def test_workers_on_either_side(workers: dict[str, Any]) -> None:
    old = World(2, 4, options=workers)
    new = World(3, 4, options={"num_workers": 0})
    exactly_once(resume(old, new, steps=4), old.n, repeats_allowed=2)
    back = World(3, 5, options=workers)
    exactly_once(resume(new, back, steps=2, state_of="merged"), old.n, repeats_allowed=2)


def test_a_resumed_run_resumes_again_on_a_third_world() -> None:
    """4 ranks, then 3 from the first checkpoint, then 2 from the second."""
    first, second, third = World(4, 3), World(3, 4), World(2, 5)
    loaders = first.loaders()
    before = lockstep([iter(loader) for loader in loaders], 2)
    state = checkpoint(loaders)[1]
    middle_loaders = second.loaders()
    for loader in middle_loaders:
        loader.load_state_dict(state)
    middle = lockstep([iter(loader) for loader in middle_loaders], 3)
    state = merge_states(checkpoint(middle_loaders))
    last_loaders = third.loaders()
    for loader in last_loaders:
        loader.load_state_dict(state)
    last = lockstep([iter(loader) for loader in last_loaders])
    seen = sorted(i for step in before + middle + last for batch in step for i in batch)
    assert sorted(set(seen)) == list(range(first.n))
    assert len(seen) - first.n <= third.world_size - 1  # the last world's padding


class _Draw:
    """Sample ``i`` is ``(i, a draw from NumPy)``: what an augmentation sees."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float]:
        import numpy as np

        return (i, float(np.random.rand()))


def _draws(loaders: list[DataLoader], steps: int | None = None) -> dict[int, float]:
    """Each sample's draw. Every rank draws its base seed from torch's generator seeded
    alike, as ranks of a seeded run do, each in its own process."""
    import torch

    found: dict[int, float] = {}
    iterators = []
    for loader in loaders:
        torch.manual_seed(0)
        iterators.append(iter(loader))
    for _ in itertools.count() if steps is None else range(steps):
        batches = [next(it, None) for it in iterators]
        if batches[0] is None:
            break
        for batch in batches:
            for i, draw in zip(ids(batch[0]), batch[1].tolist(), strict=True):
                found.setdefault(i, draw)
    return found


def test_reseed_sample_draws_depend_on_the_samples_place_only() -> None:
    """The same draw for each sample on 1 rank, on 3, and resumed from 3 on 2 with
    another batch size and workers."""
    pytest.importorskip("torch")
    options = {"reseed": "sample"}

    def world(w: int, b: int, **more: Any) -> World:
        return World(w, b, n=60, dataset=lambda: _Draw(60), options={**options, **more})

    alone = _draws(world(1, 4).loaders())
    assert _draws(world(3, 4).loaders()) == alone
    loaders = world(3, 4).loaders()
    first = _draws(loaders, steps=2)
    state = json.loads(json.dumps(loaders[2].state_dict()))
    resumed = world(2, 5, num_workers=2).loaders()
    for loader in resumed:
        loader.load_state_dict(state)
    rest = _draws(resumed)
    assert {**first, **rest} == alone


def test_skips_travel_with_the_merged_state() -> None:
    options = {"on_error": "skip", "max_errors": 5}
    old = World(2, 4, n=40, shuffle=False, dataset=lambda: Ids(40, fail_at=5), options=options)
    new = World(3, 4, n=40, shuffle=False, dataset=lambda: Ids(40, fail_at=5), options=options)
    run = resume(old, new, steps=2, state_of="merged")  # sample 5 is rank 1's, in step 2
    seen = run.delivered()
    assert seen[5] == 0 and all(seen[i] == 1 for i in range(40) if i != 5)
    for loader in run.loaders:  # every new rank has the record, rank 1's skip included
        assert next((s.index, s.epoch) for s in loader.skipped_samples) == (5, 0)


def test_torchs_own_sampler_gets_the_same_guarantees() -> None:
    torch_sampler = pytest.importorskip("torch.utils.data").DistributedSampler
    old = World(4, 4, sampler_class=torch_sampler)
    new = World(2, 4, sampler_class=torch_sampler)
    run = resume(old, new, steps=3)
    exactly_once(run, old.n, repeats_allowed=1)
    assert run.next_epoch == uninterrupted(new, epoch=new.epoch + 1)


# --- what cannot be resumed, said -----------------------------------------------------------


def _state(world: World, steps: int = 2, rank: int = 0) -> dict[str, Any]:
    loaders = world.loaders()
    lockstep([iter(loader) for loader in loaders], steps)
    return checkpoint(loaders)[rank]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"seed": 8}, "seed=7"),
        ({"shuffle": False}, "shuffle=True"),
    ],
)
def test_a_state_of_another_epoch_order_is_refused(change: dict[str, Any], words: str) -> None:
    state = _state(World(2, 4))
    loader = World(3, 4, **change).loader(0)
    with pytest.raises(StateError, match=f"rank 0 of 2.*{words}"):
        loader.load_state_dict(state)
        iter(loader)


def test_a_state_of_another_dataset_length_is_refused() -> None:
    state = _state(World(2, 4))
    with pytest.raises(StateError, match="dataset now has 104 samples"):
        World(3, 4, n=104).loader(0).load_state_dict(state)


def test_a_loader_that_does_not_shard_is_told_what_to_use() -> None:
    state = _state(World(2, 4))
    loader = DataLoader(Ids(103), batch_size=4, shuffle=True)
    loader.load_state_dict(state)
    with pytest.raises(StateError, match=r"RandomSampler.*does not shard.*DistributedSampler"):
        iter(loader)


def test_merging_states_that_do_not_belong_together_names_the_ranks() -> None:
    world = World(3, 4)
    states = [_state(world, rank=r) for r in range(3)]
    with pytest.raises(StateError, match=r"ranks \[2\] are missing"):
        merge_states(states[:2])
    with pytest.raises(StateError, match="both rank 1's"):
        merge_states([states[0], states[1], states[1]])
    later = _state(World(3, 4, epoch=2), rank=2)
    with pytest.raises(
        StateError, match=r"states 0 \(rank 0\) and 2 \(rank 2\) differ in epoch order"
    ):
        merge_states([states[0], states[1], later])
    plain = DataLoader(Ids(10), batch_size=2)
    next(iter(plain))
    with pytest.raises(StateError, match="state 0 has no ranks part"):
        merge_states([plain.state_dict()])


def test_a_dataset_with_its_own_state_resumes_only_on_the_same_ranks() -> None:
    class Counted(Ids):
        def __init__(self) -> None:
            super().__init__(40)
            self.count = 0

        def state_dict(self) -> dict[str, int]:
            return {"count": self.count}

        def load_state_dict(self, state: dict[str, int]) -> None:
            self.count = state["count"]

    state = _state(World(2, 4, n=40, dataset=Counted))
    loader = World(3, 4, n=40, dataset=Counted).loader(0)
    loader.load_state_dict(state)
    with pytest.raises(StateError, match=r"keeps a state of its own.*Resume on the same ranks"):
        iter(loader)


# --- the sampler itself ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 12, 103])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_sampler_yields_torchs_indices(n: int, world: int) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    for rank, shuffle, drop_last, seed, epoch in itertools.product(
        range(world), [True, False], [True, False], [0, 7], [0, 3]
    ):
        args = {"num_replicas": world, "rank": rank, "shuffle": shuffle, "seed": seed,
                "drop_last": drop_last}  # fmt: skip
        ours, theirs = (
            DistributedSampler(range(n), **args),
            torch_data.DistributedSampler(range(n), **args),
        )
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs) and len(ours) == len(theirs), args


def test_the_sampler_is_torchs_to_isinstance_and_refuses_a_bad_rank() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    assert isinstance(
        DistributedSampler(range(4), num_replicas=2, rank=0), torch_data.DistributedSampler
    )
    with pytest.raises(
        ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"
    ):
        DistributedSampler(range(4), num_replicas=2, rank=2)


def test_without_a_process_group_the_world_is_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    sampler = DistributedSampler(range(5), shuffle=False)
    assert (sampler.num_replicas, sampler.rank, list(sampler)) == (1, 0, [0, 1, 2, 3, 4])
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE=4.*init_process_group"):
        DistributedSampler(range(5))
