"""Duplicated data becomes loud: a DuplicateDataWarning when ranks or iterable-dataset
workers would each see everything — and none when the data is sharded."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
from conveyor import DataLoader, DuplicateDataWarning, IterableDataset

METHODS = ["fork", pytest.param("spawn", marks=pytest.mark.slow)]


class Everything(IterableDataset[int]):
    """Every worker yields every item: torch delivers each one once per worker."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(8))


class ShardedByTorch(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        return itertools.islice(range(8), info.id, None, info.num_workers)


class ShardedByConveyor(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        info = conveyor.get_worker_info()
        assert info is not None
        return itertools.islice(range(8), info.id, None, info.num_workers)


def _epochs(dataset: Any, method: str | None, epochs: int = 2, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("num_workers", 2)
    if kwargs["num_workers"] and method:
        kwargs["multiprocessing_context"] = method
    loader = DataLoader(dataset, batch_size=2, **kwargs)
    return [sorted(i for b in loader for i in b.tolist()) for _ in range(epochs)]


def _duplicates(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DuplicateDataWarning)]


@pytest.mark.parametrize("method", METHODS)
def test_workers_that_do_not_shard_are_named_once(method: str) -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        epochs = _epochs(Everything(), method)
    assert epochs[0] == sorted(list(range(8)) * 2)  # torch's behaviour: kept, but said
    [text] = _duplicates(record)  # two epochs, one warning
    assert "began this epoch with the same batch" in text
    assert "never called get_worker_info()" in text and "islice" in text


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "dataset", [pytest.param(ShardedByTorch, marks=pytest.mark.torch), ShardedByConveyor]
)
def test_sharded_workers_are_not_accused(method: str, dataset: type) -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _epochs(dataset(), method) == [list(range(8))] * 2
    assert _duplicates(record) == []


def test_one_worker_cannot_duplicate() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _epochs(Everything(), "fork", num_workers=1)
        _epochs(Everything(), None, num_workers=0)
    assert _duplicates(record) == []


@pytest.fixture
def two_ranks() -> Iterator[None]:
    """A process group of two ranks in this one process (torch's fake backend)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.parametrize("method", METHODS)
def test_ranks_without_a_distributed_sampler_are_warned(two_ranks: None, method: str) -> None:
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, multiprocessing_context=method)
    with pytest.warns(DuplicateDataWarning, match="2 ranks.*DistributedSampler") as record:
        list(loader)
    assert record[0].filename == __file__  # at the user's line
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        list(loader)
    assert _duplicates(again) == []  # once per loader


@pytest.mark.torch
@pytest.mark.parametrize("method", METHODS)
def test_ranks_with_a_distributed_sampler_are_not_warned(two_ranks: None, method: str) -> None:
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(list(range(8)), num_replicas=2, rank=0, shuffle=False)
    loader = DataLoader(
        list(range(8)), batch_size=2, sampler=sampler, num_workers=2, multiprocessing_context=method
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert [b.tolist() for b in loader] == [[0, 2], [4, 6]]
    assert _duplicates(record) == []


class EveryOtherBatch:
    """A batch sampler that shards in its own way, and says nothing of it: this rank's
    half of the batches (of ``batch_size``, as torch's batch samplers say)."""

    batch_size = 2

    def __init__(self, rank: int, ranks: int) -> None:
        self.rank, self.ranks = rank, ranks

    def __iter__(self) -> Iterator[list[int]]:
        batches = [[i, i + 1] for i in range(0, 8, 2)]
        return iter(batches[self.rank :: self.ranks])

    def __len__(self) -> int:
        return 4 // self.ranks


@pytest.mark.torch
def test_ranks_sharded_by_accelerates_batch_sampler_are_not_warned(two_ranks: None) -> None:
    """accelerate's documented path: its BatchSamplerShard shards the batches, while the
    loader's sampler stays a SequentialSampler (every rank was warned)."""
    accelerate = pytest.importorskip("accelerate.data_loader", reason="needs accelerate")
    from torch.utils.data import BatchSampler, SequentialSampler

    batches = BatchSampler(SequentialSampler(range(8)), batch_size=2, drop_last=False)
    shard = accelerate.BatchSamplerShard(batches, num_processes=2, process_index=0)
    loader = DataLoader(list(range(8)), batch_sampler=shard, num_workers=2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert [b.tolist() for b in loader] == [[0, 1], [4, 5]]
    assert _duplicates(record) == []


@pytest.mark.torch
def test_ranks_that_yield_one_share_each_are_not_warned(two_ranks: None) -> None:
    loader = DataLoader(list(range(8)), batch_sampler=EveryOtherBatch(0, 2), num_workers=2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert [b.tolist() for b in loader] == [[0, 1], [4, 5]]
    assert _duplicates(record) == []


@pytest.mark.torch
def test_a_batch_sampler_that_does_not_shard_is_named(two_ranks: None) -> None:
    loader = DataLoader(list(range(8)), batch_sampler=EveryOtherBatch(0, 1), num_workers=2)
    with pytest.warns(DuplicateDataWarning, match=r"batch sampler \(EveryOtherBatch\)"):
        list(loader)


def test_no_process_group_no_warning() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        list(DataLoader(list(range(8)), batch_size=2))
    assert _duplicates(record) == []
