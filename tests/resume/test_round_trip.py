"""Resume at any step, with any worker count, start method and ordering: the batches
(and the augmentations drawn in ``__getitem__``) are those of the uninterrupted run."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

from conveyor import DataLoader, WorkerRestartedWarning

from .datasets import Draws, seeded
from .roundtrip import assert_same, epochs_of, resumed_run

# 3 workers on a 2-core machine: torch's (and our) warning about it is expected here.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N, BATCH = 40, 4  # 10 batches an epoch
STEPS = {"start": 0, "middle": 5, "last": 9, "boundary": 11}


def _loader(num_workers: int, seed: int = 3, **kwargs: Any) -> DataLoader:
    options: dict[str, Any] = dict(
        batch_size=BATCH, shuffle=True, generator=seeded(seed), reseed="batch"
    )
    options.update(kwargs)
    dataset = options.pop("dataset", Draws(N))
    if num_workers:
        options.setdefault("multiprocessing_context", "fork")
    return DataLoader(dataset, num_workers=num_workers, **options)


def _round_trip(
    before: dict[str, Any], after: dict[str, Any], step: str, in_order: bool = True
) -> None:
    """``before``/``after``: the loader's options before and after the resume (the
    resumed loader's generator is seeded differently: the state must carry it)."""
    make = functools.partial(_loader, **before)
    expected = epochs_of(make, 2)
    got = resumed_run(make, functools.partial(_loader, seed=99, **after), STEPS[step], 2)
    assert_same(expected, got, in_order)


def _table() -> list[Any]:
    """Every step for every pair of worker counts; the default run takes the middle and
    the epoch boundary for three pairs, ``-m slow`` the rest."""
    pairs = [(0, 0), (0, 2), (2, 0), (1, 3), (3, 1)]
    cases = []
    for workers, resumed in pairs:
        for step in STEPS:
            quick = step in ("middle", "boundary") and (workers, resumed) in pairs[1:4]
            marks = () if quick else (pytest.mark.slow,)
            cases.append(pytest.param(workers, resumed, step, marks=marks))
    return cases


@pytest.mark.parametrize(("workers", "resumed_workers", "step"), _table())
def test_resume_at_any_step_with_any_worker_count(
    workers: int, resumed_workers: int, step: str
) -> None:
    _round_trip({"num_workers": workers}, {"num_workers": resumed_workers}, step)


@pytest.mark.parametrize(("workers", "resumed_workers"), [(2, 3), (3, 0), (0, 2)])
def test_out_of_order_resume_hands_out_each_batch_once(workers: int, resumed_workers: int) -> None:
    before = {"num_workers": workers, "in_order": False}
    after = {"num_workers": resumed_workers, "in_order": False}
    _round_trip(before, after, "middle", in_order=False)


@pytest.mark.parametrize("step", ["middle", "boundary"])
def test_persistent_workers_resume(step: str) -> None:
    options = {"num_workers": 2, "persistent_workers": True}
    _round_trip(options, options, step)
    _round_trip(options, {"num_workers": 1, "persistent_workers": True}, step)


@pytest.mark.torch
@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_resumes_its_own_shard(rank: int) -> None:
    from torch.utils.data import DistributedSampler

    def options() -> dict[str, Any]:
        dataset = Draws(N)
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=7)
        return {"dataset": dataset, "sampler": sampler, "shuffle": None, "num_workers": 2}

    make = functools.partial(_loader, **options())
    expected = epochs_of(make, 1)
    resumed = functools.partial(_loader, seed=99, **{**options(), "num_workers": 1})
    got = resumed_run(make, resumed, 2, 1)
    assert_same(expected, got)
    mine = sorted(i for batch in got[0] for i in batch[0])
    shard = DistributedSampler(Draws(N), num_replicas=2, rank=rank, shuffle=True, seed=7)
    assert mine == sorted(shard)  # exactly this rank's shard, nothing else


def test_resume_without_batching_and_with_drop_last() -> None:
    _round_trip(
        {"num_workers": 2, "batch_size": None}, {"num_workers": 3, "batch_size": None}, "middle"
    )
    dataset = Draws(N + 2)  # 10 full batches, the last 2 samples dropped
    before = {"num_workers": 2, "drop_last": True, "dataset": dataset}
    _round_trip(before, {**before, "num_workers": 0}, "last")


@pytest.mark.parametrize(
    "resumed_method", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)]
)
def test_resume_under_another_start_method(resumed_method: str) -> None:
    before = {"num_workers": 2, "reseed": "sample"}
    after = {"num_workers": 2, "reseed": "sample", "multiprocessing_context": resumed_method}
    _round_trip(before, after, "middle")


def test_resume_after_a_worker_was_killed(tmp_path: Any) -> None:
    """A worker SIGKILLed (and replaced) before the state was taken changes nothing."""
    marker = str(tmp_path / "killed")
    dataset = Draws(N, kill_at=2, marker=marker)  # in the first batch
    expected = epochs_of(functools.partial(_loader, 0, dataset=Draws(N), shuffle=False), 2)
    make = functools.partial(_loader, 2, dataset=dataset, shuffle=False)
    resumed = functools.partial(_loader, 3, seed=99, shuffle=False)
    with pytest.warns(WorkerRestartedWarning, match="Started a replacement"):
        got = resumed_run(make, resumed, STEPS["middle"], 2)
    assert os.path.exists(marker)
    assert_same(expected, got)


def test_skipped_samples_travel_in_the_state() -> None:
    """on_error="skip": a sample skipped before the state is recorded in the resumed
    loader too, and its batch is not fetched again."""
    options = {"num_workers": 2, "on_error": "skip", "dataset": Draws(N, fail_at=6)}
    make = functools.partial(_loader, **options)
    expected = epochs_of(make, 1)
    resumed = functools.partial(_loader, seed=99, **{**options, "num_workers": 0})
    loader_box: list[DataLoader] = []

    def keep() -> DataLoader:
        loader_box.append(resumed())
        return loader_box[-1]

    got = resumed_run(make, keep, STEPS["middle"], 1)
    assert_same(expected, got)
    [skipped] = loader_box[0].skipped_samples
    assert (skipped.index, skipped.epoch, skipped.stage) == (6, 0, "fetch")
    assert "sample 6 is corrupt" in skipped.message
