"""Datasets and collate functions shared by the torch-parity tests.

Everything here is module-level and importable, so torch's own DataLoader can
pickle it by reference under ``spawn`` and ``forkserver``. Samples carry their
index (and, where it matters, the worker that made them) so that a mismatch
names what went wrong.
"""

from __future__ import annotations

import random
from collections import OrderedDict, defaultdict
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

import conveyor
from tests.helpers.sync import post, wait_posted

KINDS = (
    "tensor",
    "dict_numpy",
    "tuple",
    "namedtuple",
    "list",
    "scalars",
    "strings",
    "nested",
    "mapping_types",
    "dtypes",
)


class Point(NamedTuple):
    x: int
    y: Any


def worker_info(source: str) -> Any:
    """This worker's info from torch's getter or conveyor's (None in the main process)."""
    if source == "torch":
        return torch.utils.data.get_worker_info()
    if source == "conveyor":
        return conveyor.get_worker_info()
    raise ValueError(f"unknown worker-info source {source!r}")


def make_sample(kind: str, i: int) -> Any:
    if kind == "tensor":
        return torch.arange(4) + i, torch.full((2, 2), float(i), dtype=torch.float32)
    if kind == "dict_numpy":
        return {
            "index": i,
            "a": np.arange(3, dtype=np.float32) + i,
            "b": np.full((2, 2), i, dtype=np.int16),
            "c": np.array(i % 256, dtype=np.uint8),
        }
    if kind == "tuple":
        return (i, i / 2, np.array([i, -i], dtype=np.int64))
    if kind == "namedtuple":
        return Point(x=i, y=np.float64(i) * 1.5)
    if kind == "list":
        return [i, [i, i + 1], np.int32(i)]
    if kind == "scalars":
        return {
            "int": i,
            "float": i * 0.25,
            "bool": i % 2 == 0,
            "np_int": np.int64(i),
            "np_float": np.float32(i) / 3,
            "np_bool": np.bool_(i % 3 == 0),
        }
    if kind == "strings":
        return {"name": f"item-{i}", "raw": f"b{i}".encode(), "index": i}
    if kind == "nested":
        return {
            "items": [
                {"a": i, "b": np.ones(2) * i},
                {"a": -i, "b": np.zeros(2)},
            ],
            "meta": {"name": str(i), "t": torch.tensor([i, 2 * i], dtype=torch.int32)},
            "pair": (Point(i, float(i)), [True, i > 4]),
        }
    if kind == "mapping_types":
        counts: defaultdict[str, int] = defaultdict(int, {"seen": i})
        return OrderedDict([("z", i), ("counts", counts), ("a", np.array([i, i], np.float16))])
    if kind == "dtypes":
        dtypes = (torch.bfloat16, torch.float16, torch.bool, torch.complex64, torch.int8)
        sample = {str(d): torch.full((2,), i, dtype=d) for d in dtypes}
        sample["uint16"] = torch.tensor([i], dtype=torch.uint16)
        sample["empty"] = torch.empty(0, 3)
        sample["scalar"] = torch.tensor(float(i))
        sample["np_bool"] = np.array([i % 2 == 0, True])
        sample["np_complex"] = np.array([1j * i], np.complex64)
        return sample
    raise ValueError(f"unknown sample kind {kind!r}")


class MapDataset(Dataset):
    """``n`` samples of one ``kind`` (see :data:`KINDS`)."""

    def __init__(self, n: int = 10, kind: str = "dict_numpy") -> None:
        self.n = n
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return make_sample(self.kind, i)


class GetItemsDataset(MapDataset):
    """Fetches whole batches through ``__getitems__``, as torch's fetcher prefers."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return [{"index": i, "batched": len(indices)} for i in indices]


class SlowFirstDataset(MapDataset):
    """Sample 0 is slow: it takes until the last sample has been fetched (posted to the
    mailbox at ``mailbox``). Each sample reports the worker that made it."""

    def __init__(self, mailbox: str, n: int = 10) -> None:
        super().__init__(n)
        self.mailbox = mailbox

    def __getitem__(self, i: int) -> Any:
        if i == 0:
            wait_posted(self.mailbox)  # a TimeoutError if the last one waits behind it
        if i == self.n - 1:
            post(self.mailbox, str(i))
        return i, torch.utils.data.get_worker_info().id


class RandomDataset(Dataset):
    """Each sample draws from ``random``, NumPy's and torch's global RNGs."""

    def __init__(self, n: int = 12, info_from: str = "torch") -> None:
        self.n = n
        self.info_from = info_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        info = worker_info(self.info_from)
        return {
            "index": i,
            "py": random.random(),
            "np": np.random.rand(),
            "torch": torch.rand(1),
            "worker": -1 if info is None else info.id,
            "seed": -1 if info is None else info.seed,
        }


def shard_bounds(n: int, num_workers: int, worker_id: int) -> tuple[int, int]:
    """Uneven contiguous shards: worker ``k`` gets a share ∝ ``k + 1``."""
    total = num_workers * (num_workers + 1) // 2
    before = worker_id * (worker_id + 1) // 2
    return n * before // total, n * (before + worker_id + 1) // total


class ShardedIterable(IterableDataset):
    """``range(n)`` split into uneven shards with ``get_worker_info()``.

    ``random_values`` adds draws from the three global RNGs to each sample.
    """

    def __init__(self, n: int = 23, info_from: str = "torch", random_values: bool = False):
        self.n = n
        self.info_from = info_from
        self.random_values = random_values

    def __iter__(self) -> Iterator[Any]:
        info = worker_info(self.info_from)
        if info is None:
            lo, hi, worker = 0, self.n, -1
        else:
            lo, hi = shard_bounds(self.n, info.num_workers, info.id)
            worker = info.id
        for i in range(lo, hi):
            sample: dict[str, Any] = {"i": i, "worker": worker, "x": np.full(2, i, np.float32)}
            if self.random_values:
                sample["py"] = random.random()
                sample["np"] = np.random.rand()
                sample["torch"] = torch.rand(1)
            yield sample


class SizedShardedIterable(ShardedIterable):
    def __len__(self) -> int:
        return self.n


class UnshardedIterable(IterableDataset):
    """Every worker yields all of ``range(n)``: duplicates, as torch gives them."""

    def __init__(self, n: int = 7) -> None:
        self.n = n

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker = -1 if info is None else info.id
        for i in range(self.n):
            yield (i, worker)


class SizedUnshardedIterable(UnshardedIterable):
    """Reports ``n`` samples but yields ``n`` per worker."""

    def __len__(self) -> int:
        return self.n


class RangeIterable(IterableDataset):
    """torch's documented pattern: ``worker_init_fn`` narrows each worker's range."""

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


def split_range_worker_init(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    dataset = info.dataset
    per_worker = -(-(dataset.end - dataset.start) // info.num_workers)
    dataset.start = dataset.start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, dataset.end)


def reseed_numpy_worker_init(worker_id: int) -> None:
    """The common recipe for per-worker NumPy seeds."""
    np.random.seed((torch.initial_seed() + worker_id) % 2**32)
    random.seed(torch.initial_seed() * 3 + worker_id)


class EagerShuffleBatchSampler:
    """Shuffles with torch's global RNG inside ``__iter__`` itself, not lazily."""

    def __init__(self, n: int, batch_size: int) -> None:
        self.n = n
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        perm = torch.randperm(self.n).tolist()
        return iter([perm[i : i + self.batch_size] for i in range(0, self.n, self.batch_size)])

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)


class EagerShuffleSampler:
    """Shuffles with torch's global RNG inside ``__iter__`` itself: inside a loader's
    ``BatchSampler``, torch opens it at the first batch, after the base seed is drawn."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class NoLenSampler:
    """An iterable of indices without ``__len__``."""

    def __init__(self, indices: list[int]) -> None:
        self.indices = indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)


# --- collate functions (for MapDataset(kind="dict_numpy")) --------------------


def collate_numpy(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """NumPy arrays out, not tensors."""
    return {
        "index": [s["index"] for s in batch],
        "a": np.stack([s["a"] for s in batch]),
        "c": np.array([int(s["c"]) for s in batch], dtype=np.int32),
    }


def collate_sum(batch: list[dict[str, Any]]) -> tuple[Any, ...]:
    return (
        torch.tensor(sum(s["index"] for s in batch)),
        torch.stack([torch.from_numpy(s["a"]) for s in batch]).sum(dim=0),
        len(batch),
    )


def collate_identity(batch: list[Any]) -> list[Any]:
    return batch


def collate_views(batch: list[Any]) -> dict[str, Any]:
    """Tensors that are views: transposed, strided, and two sharing one storage."""
    base = torch.arange(12.0).reshape(3, 4) + len(batch)
    return {"transposed": base.t(), "column": base[:, 1], "alias": (base, base[0])}


def collate_conj(batch: list[Any]) -> Any:
    """A lazily conjugated tensor (its conjugate bit is set)."""
    return torch.tensor([1 + 2j, 3 - 1j] * len(batch), dtype=torch.complex64).conj()
