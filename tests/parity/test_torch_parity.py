"""conveyor.DataLoader against torch.utils.data.DataLoader, batch by batch.

Every case builds both loaders from the same arguments (fresh generators and
samplers for each), seeds the global RNGs identically before iterating, and
compares every batch: type, nesting, dtype, shape and values. ``len(loader)``
must match too, or fail with the same exception type. ``in_order=False``
compares each epoch as a multiset of batches.

The cases are a representative cross-product, not a full one: each axis
(batch size, sampler, sample type, dataset style, workers, start method,
persistence, prefetch, ordering) is swept against a cheap default of the others.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import pickle
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.fake_kind import FAKE, registered

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

import conveyor  # noqa: E402
from tests.helpers.sync import Mailbox  # noqa: E402

from . import datasets as ds  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]

SEED = 1234
SIDES = ("torch", "conveyor")
SAMPLERS = {"torch": torch.utils.data, "conveyor": conveyor}
Kwargs = Callable[[str], dict[str, Any]]


# --- comparing batches ---------------------------------------------------------


def assert_batches_equal(a: Any, b: Any, path: str = "") -> None:
    """Assert ``a`` (conveyor's) and ``b`` (torch's) are the same batch, recursively.

    Types must be identical at every level (a namedtuple is not a tuple, a
    NumPy scalar not a Python number); tensors and arrays must agree in dtype,
    shape, strides, and values exactly.
    """
    where = path or "batch"
    if type(a) is not type(b):
        raise AssertionError(
            f"{where}: type {type(a).__name__} (conveyor) != {type(b).__name__} (torch)"
        )
    if isinstance(a, torch.Tensor):
        _assert_tensors_equal(a, b, where)
    elif isinstance(a, np.ndarray):
        _assert_arrays_equal(a, b, where)
    elif isinstance(a, Mapping):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError(f"{where}: keys {list(a)} (conveyor) != {list(b)} (torch)")
        for key in a:
            assert_batches_equal(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{where}: length {len(a)} (conveyor) != {len(b)} (torch)")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_batches_equal(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        if not math.isnan(b):
            raise AssertionError(f"{where}: nan (conveyor) != {b!r} (torch)")
    elif a != b:
        raise AssertionError(f"{where}: {a!r} (conveyor) != {b!r} (torch)")


def _assert_tensors_equal(a: Any, b: Any, where: str) -> None:
    for attr in ("dtype", "shape", "device", "requires_grad", "layout"):
        if getattr(a, attr) != getattr(b, attr):
            raise AssertionError(
                f"{where}: tensor {attr} {getattr(a, attr)} (conveyor) != "
                f"{getattr(b, attr)} (torch)"
            )
    if a.stride() != b.stride():
        raise AssertionError(f"{where}: tensor stride {a.stride()} (conveyor) != {b.stride()}")
    if not torch.equal(a, b) and not (a.is_floating_point() and _nan_equal(a, b)):
        raise AssertionError(f"{where}: tensor values\n{a}\n(conveyor) !=\n{b}\n(torch)")


def _nan_equal(a: Any, b: Any) -> bool:
    return bool(torch.equal(torch.isnan(a), torch.isnan(b))) and bool(
        torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    )


def _assert_arrays_equal(a: np.ndarray, b: np.ndarray, where: str) -> None:
    if a.dtype != b.dtype or a.shape != b.shape:
        raise AssertionError(
            f"{where}: array {a.dtype}{list(a.shape)} (conveyor) != {b.dtype}{list(b.shape)}"
        )
    if not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
        raise AssertionError(f"{where}: array values\n{a}\n(conveyor) !=\n{b}\n(torch)")
    if a.flags.writeable != b.flags.writeable:
        raise AssertionError(
            f"{where}: array writeable={a.flags.writeable} (conveyor) != "
            f"{b.flags.writeable} (torch)"
        )


def _matches(a: Any, b: Any) -> bool:
    try:
        assert_batches_equal(a, b)
    except AssertionError:
        return False
    return True


def test_assert_batches_equal_names_the_difference() -> None:
    base = {"x": [torch.zeros(2), (1, "a")], "y": np.ones(3, np.float32)}
    assert_batches_equal(base, {"x": [torch.zeros(2), (1, "a")], "y": np.ones(3, np.float32)})
    bad = [
        ({"x": [torch.zeros(2), [1, "a"]], "y": np.ones(3, np.float32)}, r"\['x'\]\[1\]: type"),
        ({"x": [torch.zeros(3), (1, "a")], "y": np.ones(3, np.float32)}, r"\[0\]: tensor shape"),
        ({"x": [torch.ones(2), (1, "a")], "y": np.ones(3, np.float32)}, "tensor values"),
        ({"x": [torch.zeros(2), (1, "b")], "y": np.ones(3, np.float32)}, r"\[1\]\[1\]: 'a'"),
        ({"x": [torch.zeros(2), (1, "a")], "y": np.ones(3, np.float64)}, r"\['y'\]: array"),
        ({"y": np.ones(3, np.float32), "x": [torch.zeros(2), (1, "a")]}, "keys"),
    ]
    for other, message in bad:
        with pytest.raises(AssertionError, match=message):
            assert_batches_equal(base, other)
    with pytest.raises(AssertionError, match="type int"):
        assert_batches_equal(1, 1.0)
    with pytest.raises(AssertionError, match="type Point"):
        assert_batches_equal(ds.Point(1, 2), (1, 2))


# --- running a case on both loaders ----------------------------------------------


@dataclass(frozen=True)
class Case:
    dataset: Callable[[], Any]
    kwargs: Kwargs
    conveyor_dataset: Callable[[], Any] | None = None  # defaults to ``dataset``
    epochs: int = 1
    stop_after: tuple[int | None, ...] = ()  # per epoch: break after this many batches

    def build(self, side: str) -> Any:
        make = self.dataset
        if side == "conveyor" and self.conveyor_dataset is not None:
            make = self.conveyor_dataset
        cls = TorchDataLoader if side == "torch" else conveyor.DataLoader
        return cls(make(), **self.kwargs(side))

    def limit(self, epoch: int) -> int | None:
        return self.stop_after[epoch] if epoch < len(self.stop_after) else None


def seed_everything(seed: int = SEED) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def length_of(loader: Any) -> Any:
    """``len(loader)``, or the type of what it raised."""
    try:
        return len(loader)
    except Exception as exc:  # compared by type against torch's
        return type(exc)


def run_epochs(loader: Any, case: Case, on_batch: Callable[[int, Any], None]) -> None:
    """Iterate ``case.epochs`` times over one loader object, seeded once before."""
    seed_everything()
    for epoch in range(case.epochs):
        limit = case.limit(epoch)
        for count, batch in enumerate(loader, 1):
            on_batch(epoch, batch)
            del batch  # conveyor's batch holds a shared-memory slot
            if count == limit:
                break


def _join_torchs_queue_threads(timeout: float = 60.0) -> None:
    """torch's shut-down loader leaves its queues' feeder threads to end on their own: one
    still running when conveyor forks its workers is a thread fork copies a lock of, and
    conveyor's pre-flight warns of it (an error here). Seen in CI, 1 run in 432 on busy
    cores; a user's script forking just after torch's loader would be warned the same."""
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread":
            thread.join(timeout)
            assert not thread.is_alive(), "torch's queue feeder thread did not end in 60 s"


def check_parity(case: Case) -> None:
    # len() on separate loaders: asking an iterable-style loader its length
    # arms torch's "more batches than len()" warning for the iterated one.
    torch_len, conveyor_len = (length_of(case.build(side)) for side in SIDES)
    assert conveyor_len == torch_len, f"len(loader): {conveyor_len} (conveyor) != {torch_len}"

    expected: list[list[Any]] = [[] for _ in range(case.epochs)]
    torch_loader = case.build("torch")
    run_epochs(torch_loader, case, lambda epoch, batch: expected[epoch].append(batch))
    del torch_loader  # stops persistent torch workers
    _join_torchs_queue_threads()

    conveyor_loader = case.build("conveyor")
    unordered = not conveyor_loader.in_order
    seen = [0] * case.epochs

    def compare(epoch: int, batch: Any) -> None:
        n = seen[epoch]
        seen[epoch] += 1
        where = f"epoch {epoch} batch {n}"
        if unordered:
            remaining = expected[epoch]
            match = next((i for i, ref in enumerate(remaining) if _matches(batch, ref)), None)
            assert match is not None, f"{where}: {batch!r} is not among torch's {remaining!r}"
            remaining.pop(match)
            return
        assert n < len(expected[epoch]), (
            f"{where}: conveyor yields more than torch's {len(expected[epoch])} batches"
        )
        assert_batches_equal(batch, expected[epoch][n], where)

    run_epochs(conveyor_loader, case, compare)
    for epoch, reference in enumerate(expected):
        if unordered:
            assert not reference, f"epoch {epoch}: conveyor never yielded {reference!r}"
        else:
            assert seen[epoch] == len(reference), (
                f"epoch {epoch}: {seen[epoch]} batches (conveyor) != {len(reference)} (torch)"
            )


# --- the table ---------------------------------------------------------------------


def gen(seed: int = 7) -> Any:
    return torch.Generator().manual_seed(seed)


def case(
    id: str,
    dataset: Callable[[], Any],
    kwargs: Kwargs | dict[str, Any] | None = None,
    marks: Any = (),
    **options: Any,
) -> Any:
    if not callable(kwargs):
        fixed = dict(kwargs or {})
        kwargs = lambda side: dict(fixed)  # noqa: E731
    return pytest.param(Case(dataset, kwargs, **options), id=id, marks=marks)


def mapped(n: int = 10, kind: str = "dict_numpy") -> Callable[[], Any]:
    return lambda: ds.MapDataset(n, kind)


def randoms(n: int = 12, info_from: str = "torch") -> Callable[[], Any]:
    return lambda: ds.RandomDataset(n, info_from)


def sharded(n: int = 23, info_from: str = "torch", **options: Any) -> Callable[[], Any]:
    return lambda: ds.ShardedIterable(n, info_from, **options)


def batch_size_cases() -> list[Any]:
    cases = []
    for bs in (1, 3, 7, 10, 16):  # 10 is the whole dataset, 16 more than it
        for drop_last in (False, True):
            for workers in (0, 2) if bs in (3, 16) else (2,):
                cases.append(
                    case(
                        f"bs{bs}-drop{int(drop_last)}-w{workers}",
                        mapped(),
                        dict(batch_size=bs, drop_last=drop_last, num_workers=workers),
                    )
                )
    for workers in (0, 2):
        cases.append(
            case(f"bs-None-w{workers}", mapped(), dict(batch_size=None, num_workers=workers))
        )
    return cases


def sample_type_cases() -> list[Any]:
    cases = []
    for kind in ds.KINDS:
        cases += [
            case(f"{kind}-bs4-w0", mapped(kind=kind), dict(batch_size=4)),
            case(f"{kind}-bs3-w2", mapped(kind=kind), dict(batch_size=3, num_workers=2)),
            case(f"{kind}-bsNone-w1", mapped(kind=kind), dict(batch_size=None, num_workers=1)),
        ]
    return cases


def collate_cases() -> list[Any]:
    return [
        case(
            "collate-numpy-w2",
            mapped(),
            dict(batch_size=3, num_workers=2, collate_fn=ds.collate_numpy),
        ),
        case("collate-sum-w0", mapped(), dict(batch_size=4, collate_fn=ds.collate_sum)),
        case(
            "collate-sum-w3", mapped(), dict(batch_size=4, num_workers=3, collate_fn=ds.collate_sum)
        ),
        case(
            "collate-identity-w2",
            mapped(),
            dict(batch_size=3, num_workers=2, collate_fn=ds.collate_identity),
        ),
        case(
            "collate-identity-bsNone-w2",
            mapped(kind="nested"),
            dict(batch_size=None, num_workers=2, collate_fn=ds.collate_identity),
        ),
        case(
            "collate-lambda-w0",
            mapped(),
            dict(batch_size=3, collate_fn=lambda b: [s["index"] * 2 for s in b]),
        ),
        case(
            "collate-lambda-fork-w2",
            mapped(),
            {
                "batch_size": 3,
                "num_workers": 2,
                "multiprocessing_context": "fork",
                "collate_fn": lambda b: dict(twice=[s["index"] * 2 for s in b]),
            },
        ),
    ]


def dataset_type_cases() -> list[Any]:
    """Datasets that are not torch ``Dataset`` subclasses, and edge sizes."""
    pairs = lambda: [(i, float(i) / 4) for i in range(9)]  # noqa: E731
    array = lambda: np.arange(20, dtype=np.float32).reshape(10, 2)  # noqa: E731
    tensors = lambda: torch.utils.data.TensorDataset(torch.arange(10), torch.ones(10, 2))  # noqa: E731
    by_name = lambda: {"a": np.ones(2), "b": np.zeros(2), "c": np.full(2, 3.0)}  # noqa: E731
    return [
        case("list-of-tuples-w0", pairs, dict(batch_size=4)),
        case("list-of-tuples-w2", pairs, dict(batch_size=4, num_workers=2)),
        case("numpy-array-w2", array, dict(batch_size=3, num_workers=2)),
        case("numpy-array-bsNone-w2", array, dict(batch_size=None, num_workers=2)),
        case("tensor-dataset-w2", tensors, dict(batch_size=4, num_workers=2, shuffle=True)),
        case(
            "dict-keys-sampler-w2", by_name, dict(sampler=list("caba"), batch_size=3, num_workers=2)
        ),
        case("getitems-w0", lambda: ds.GetItemsDataset(7), dict(batch_size=3)),
        case("getitems-w2", lambda: ds.GetItemsDataset(7), dict(batch_size=3, num_workers=2)),
        case("empty-map-w0", lambda: ds.MapDataset(0), dict(batch_size=3)),
        case("empty-map-w2", lambda: ds.MapDataset(0), dict(batch_size=3, num_workers=2)),
        case("empty-iterable-w2", sharded(0), dict(batch_size=3, num_workers=2)),
        case("empty-shard-w3", sharded(4), dict(batch_size=3, num_workers=3)),
        case(
            "batch-sampler-arrays-tuples-ranges-w2",
            mapped(),
            dict(batch_sampler=[np.array([3, 1]), (0, 9), range(4, 7)], num_workers=2),
        ),
        case(
            "worker-init-split-range-w2",
            lambda: ds.RangeIterable(3, 16),
            dict(batch_size=2, num_workers=2, worker_init_fn=ds.split_range_worker_init),
        ),
        case(
            "worker-init-split-range-w3",
            lambda: ds.RangeIterable(0, 10),
            dict(batch_size=None, num_workers=3, worker_init_fn=ds.split_range_worker_init),
        ),
        case(
            "worker-init-reseed-w2",
            randoms(),
            dict(batch_size=3, num_workers=2, worker_init_fn=ds.reseed_numpy_worker_init),
        ),
    ]


def sampler_cases() -> list[Any]:
    def equivalent(name: str, *args: Any, **kwargs: Any) -> Kwargs:
        """Torch's sampler class for torch, conveyor's for conveyor, same arguments."""

        def make(side: str) -> dict[str, Any]:
            options = {k: v() if callable(v) else v for k, v in kwargs.items()}
            sampler = getattr(SAMPLERS[side], name)(*args, **options)
            return dict(sampler=sampler, batch_size=3, num_workers=2)

        return make

    def torch_object(name: str, *args: Any, workers: int = 2, **kwargs: Any) -> Kwargs:
        """Torch's own sampler object, given to both loaders."""

        def make(side: str) -> dict[str, Any]:
            options = {k: v() if callable(v) else v for k, v in kwargs.items()}
            sampler = getattr(torch.utils.data, name)(*args, **options)
            return dict(sampler=sampler, batch_size=3, num_workers=workers)

        return make

    data = ds.MapDataset(10)
    weights = [0.1, 2.0, 0.5, 1.0, 0.0, 3.0, 0.2, 1.0, 1.0, 0.7]
    cases = (
        [
            case(
                f"shuffle-manual-seed-w{w}",
                mapped(),
                dict(batch_size=3, shuffle=True, num_workers=w),
            )
            for w in (0, 2, 3)
        ]
        + [
            case(
                f"shuffle-generator-w{w}",
                mapped(),
                lambda side, w=w: dict(batch_size=3, shuffle=True, num_workers=w, generator=gen()),
            )
            for w in (0, 2)
        ]
        + [
            case(
                "shuffle-generator-bsNone-w2",
                mapped(),
                lambda side: dict(batch_size=None, shuffle=True, num_workers=2, generator=gen()),
            ),
            case(
                "random-sampler-torch-object",
                mapped(),
                torch_object("RandomSampler", data, generator=gen),
            ),
            case("random-sampler-global-rng", mapped(), equivalent("RandomSampler", data)),
            case(
                "random-sampler-num-samples",
                mapped(),
                equivalent("RandomSampler", data, num_samples=13, generator=gen),
            ),
            case(
                "random-sampler-replacement",
                mapped(),
                equivalent("RandomSampler", data, replacement=True, num_samples=40, generator=gen),
            ),
            case(
                "subset-random-torch-object-w0",
                mapped(),
                torch_object("SubsetRandomSampler", [9, 1, 4, 7, 2], workers=0, generator=gen),
            ),
            case(
                "subset-random-sampler",
                mapped(),
                equivalent("SubsetRandomSampler", [9, 1, 4, 7, 2], generator=gen),
            ),
            case(
                "subset-random-global-rng",
                mapped(),
                equivalent("SubsetRandomSampler", [3, 0, 8, 5]),
            ),
            case(
                "weighted-torch-object",
                mapped(),
                torch_object("WeightedRandomSampler", weights, 15, generator=gen),
            ),
            case(
                "weighted-replacement",
                mapped(),
                equivalent("WeightedRandomSampler", weights, 15, generator=gen),
            ),
            case(
                "weighted-no-replacement",
                mapped(),
                equivalent("WeightedRandomSampler", weights, 8, replacement=False, generator=gen),
            ),
            case(
                "list-sampler-w2",
                mapped(),
                dict(sampler=[9, 0, 3, 3, 5, 1, 8], batch_size=2, num_workers=2),
            ),
            case(
                "list-sampler-bsNone-w2",
                mapped(),
                dict(sampler=[4, 2, 2, 9], batch_size=None, num_workers=2),
            ),
            case(
                "no-len-sampler-w2",
                mapped(),
                lambda side: dict(
                    sampler=ds.NoLenSampler([5, 1, 6, 0, 2]), batch_size=2, num_workers=2
                ),
            ),
            case(
                "batch-sampler-torch-object-w2",
                mapped(),
                lambda side: dict(
                    batch_sampler=torch.utils.data.BatchSampler(
                        torch.utils.data.RandomSampler(range(10), generator=gen()), 3, False
                    ),
                    num_workers=2,
                ),
            ),
            case(
                "batch-sampler-equivalent-w0",
                mapped(),
                lambda side: dict(
                    batch_sampler=SAMPLERS[side].BatchSampler(
                        SAMPLERS[side].SequentialSampler(range(10)), 4, True
                    )
                ),
            ),
            case(
                "eager-batch-sampler-w0",
                randoms(),
                lambda side: dict(batch_sampler=ds.EagerShuffleBatchSampler(12, 5)),
            ),
            case(
                "eager-batch-sampler-w2",
                randoms(),
                lambda side: dict(batch_sampler=ds.EagerShuffleBatchSampler(12, 5), num_workers=2),
            ),
            case(
                "eager-sampler-in-batches-w0",
                randoms(),
                lambda side: dict(sampler=ds.EagerShuffleSampler(12), batch_size=5),
            ),
            case(
                "eager-sampler-in-batches-w2",
                randoms(),
                lambda side: dict(sampler=ds.EagerShuffleSampler(12), batch_size=5, num_workers=2),
            ),
            case(
                "batch-sampler-lists-w2",
                mapped(),
                dict(batch_sampler=[[0, 5], [1, 2, 3], [9], [4, 4, 4]], num_workers=2),
            ),
        ]
    )
    return cases


def iterable_cases() -> list[Any]:
    cases = [
        case(f"sharded-bs4-w{w}", sharded(), dict(batch_size=4, num_workers=w))
        for w in (0, 1, 2, 3)
    ] + [
        case("sharded-bs4-drop-w2", sharded(), dict(batch_size=4, drop_last=True, num_workers=2)),
        case("sharded-bs5-drop-w3", sharded(), dict(batch_size=5, drop_last=True, num_workers=3)),
        case("sharded-bs1-w2", sharded(), dict(batch_size=1, num_workers=2)),
        case("sharded-bs30-w2", sharded(), dict(batch_size=30, num_workers=2)),
        case("sharded-bs30-drop-w2", sharded(), dict(batch_size=30, drop_last=True, num_workers=2)),
        case("sharded-bsNone-w3", sharded(), dict(batch_size=None, num_workers=3)),
        case(
            "sharded-random-bs3-w2", sharded(random_values=True), dict(batch_size=3, num_workers=2)
        ),
        case("sharded-unordered-w3", sharded(), dict(batch_size=2, num_workers=3, in_order=False)),
        case(
            "sized-sharded-bs4-w2",
            lambda: ds.SizedShardedIterable(23),
            dict(batch_size=4, num_workers=2),
        ),
        case(
            "sized-sharded-bs4-drop-w2",
            lambda: ds.SizedShardedIterable(23),
            dict(batch_size=4, drop_last=True, num_workers=2),
        ),
        case("sized-sharded-bsNone-w0", lambda: ds.SizedShardedIterable(9), dict(batch_size=None)),
        case("unsharded-bs3-w0", lambda: ds.UnshardedIterable(7), dict(batch_size=3)),
        case(
            "unsharded-bs3-w2", lambda: ds.UnshardedIterable(7), dict(batch_size=3, num_workers=2)
        ),
        case(
            "unsharded-bsNone-w3",
            lambda: ds.UnshardedIterable(4),
            dict(batch_size=None, num_workers=3),
        ),
    ]
    # The same dataset sharded with conveyor.get_worker_info() on conveyor's side.
    for id, options in [
        ("bs4-w2", dict(batch_size=4, num_workers=2)),
        ("bs5-drop-w3", dict(batch_size=5, drop_last=True, num_workers=3)),
        ("bsNone-w4", dict(batch_size=None, num_workers=4)),
    ]:
        cases.append(
            case(
                f"conveyor-info-sharded-{id}",
                sharded(),
                options,
                conveyor_dataset=sharded(info_from="conveyor"),
            )
        )
    return cases


def worker_cases() -> list[Any]:
    """Worker RNG seeding and round-robin dispatch: random draws land on the same samples."""
    cases = (
        [
            case(f"random-shuffle-w{w}", randoms(), dict(batch_size=2, shuffle=True, num_workers=w))
            for w in (0, 1, 2, 3, 4)
        ]
        + [
            case(
                f"random-conveyor-info-w{w}",
                randoms(),
                dict(batch_size=2, num_workers=w),
                conveyor_dataset=randoms(info_from="conveyor"),
            )
            for w in (2, 3)
        ]
        + [
            case(
                f"random-prefetch{p}-w2",
                randoms(),
                dict(batch_size=2, num_workers=2, prefetch_factor=p),
            )
            for p in (1, 2, 4)
        ]
        + [
            case("timeout-w2", mapped(), dict(batch_size=3, num_workers=2, timeout=30)),
            case(
                "random-prefetch1-w3-bsNone",
                randoms(7),
                dict(batch_size=None, num_workers=3, prefetch_factor=1),
            ),
            case("unordered-bs1-w2", mapped(), dict(batch_size=1, num_workers=2, in_order=False)),
            case(
                "unordered-bs3-w3-prefetch1",
                mapped(),
                dict(batch_size=3, num_workers=3, in_order=False, prefetch_factor=1),
            ),
            case(
                "unordered-shuffle-w2",
                mapped(kind="nested"),
                lambda side: dict(
                    batch_size=2, num_workers=2, in_order=False, shuffle=True, generator=gen()
                ),
            ),
        ]
    )
    return cases


def start_method_cases() -> list[Any]:
    """spawn and forkserver workers import torch (1-3 s each), so only a few, small."""
    return [
        case(
            "spawn-random-shuffle-w2",
            randoms(8),
            dict(batch_size=3, shuffle=True, num_workers=2, multiprocessing_context="spawn"),
        ),
        case(
            "spawn-conveyor-info-sharded-w2",
            sharded(11),
            dict(batch_size=2, num_workers=2, multiprocessing_context="spawn"),
            conveyor_dataset=sharded(11, info_from="conveyor"),
        ),
        case(
            "forkserver-nested-w1",
            mapped(6, "nested"),
            dict(batch_size=4, num_workers=1, multiprocessing_context="forkserver"),
        ),
        case(
            "forkserver-context-object-random-w1",
            sharded(9, random_values=True),
            lambda side: dict(
                batch_size=None,
                num_workers=1,
                multiprocessing_context=multiprocessing.get_context("forkserver"),
            ),
        ),
    ]


def epoch_cases() -> list[Any]:
    def persistent(*, exact_prefetch: bool = False, **extra: Any) -> Kwargs:
        # After a break, the tasks still out run in the workers (torch's and ours) and
        # draw from their random streams: compare with torch's count of them, exactly
        # prefetch_factor per worker (conveyor's run-ahead sends small batches further).
        exact = {"run_ahead": False} if exact_prefetch else {}
        return lambda side: {
            "batch_size": 2,
            "shuffle": True,
            "generator": gen(),
            "num_workers": 2,
            "persistent_workers": True,
            **extra,
            **(exact if side == "conveyor" else {}),
        }

    return [
        case("persistent-3-epochs", randoms(), persistent(), epochs=3),
        case(
            "persistent-break-epoch0",
            randoms(),
            persistent(exact_prefetch=True),
            epochs=3,
            stop_after=(2,),
        ),
        case(
            "persistent-break-epoch1-w3-prefetch1",
            randoms(),
            persistent(exact_prefetch=True, num_workers=3, prefetch_factor=1),
            epochs=3,
            stop_after=(None, 1),
        ),
        case("persistent-unordered", mapped(), persistent(in_order=False), epochs=3),
        # No random draws here: after a break, torch's workers draw for a timing-dependent
        # number of stale tasks (it dispatches one more whenever a worker's end of shard
        # arrives early), so even torch does not repeat itself.
        case(
            "persistent-sharded-break",
            sharded(15),
            lambda side: dict(batch_size=3, num_workers=2, persistent_workers=True),
            epochs=3,
            stop_after=(2,),
        ),
        case(
            "epochs-global-rng-w2",
            randoms(),
            dict(batch_size=2, shuffle=True, num_workers=2),
            epochs=3,
            stop_after=(None, 2),
        ),
        case("epochs-global-rng-w0", randoms(), dict(batch_size=5, shuffle=True), epochs=2),
        case(
            "epochs-generator-w2",
            randoms(),
            lambda side: dict(batch_size=3, shuffle=True, num_workers=2, generator=gen()),
            epochs=3,
        ),
    ]


@pytest.mark.parametrize("case", batch_size_cases())
def test_batch_sizes(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", sample_type_cases())
def test_sample_types(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", collate_cases())
def test_collate_fn(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", dataset_type_cases())
def test_dataset_types(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", sampler_cases())
def test_samplers(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", iterable_cases())
def test_iterable_datasets(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", worker_cases())
def test_workers_randomness_and_ordering(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", start_method_cases())
def test_start_methods(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("case", epoch_cases())
def test_epochs(case: Case) -> None:
    check_parity(case)


@pytest.mark.slow  # spawned workers import torch (about 3 s)
def test_lambda_collate_under_spawn() -> None:
    """torch cannot pickle a lambda for spawn workers; conveyor can, and matches fork."""

    def kwargs(context: str) -> dict[str, Any]:
        return {
            "batch_size": 3,
            "num_workers": 1,  # one spawned worker is enough to need pickling
            "multiprocessing_context": context,
            "collate_fn": lambda b: {"ids": [s["index"] for s in b], "a": [s["a"] for s in b]},
        }

    with (
        pytest.raises((pickle.PicklingError, AttributeError, TypeError)),
        pytest.warns(UserWarning, match="pickle error"),
    ):
        iter(TorchDataLoader(ds.MapDataset(8), **kwargs("spawn")))
    reference = Case(mapped(8), lambda side: kwargs("fork"))
    expected: list[Any] = []
    run_epochs(reference.build("torch"), reference, lambda _, batch: expected.append(batch))
    loader = conveyor.DataLoader(ds.MapDataset(8), **kwargs("spawn"))
    got = [0]

    def compare(_: int, batch: Any) -> None:
        assert_batches_equal(batch, expected[got[0]], f"batch {got[0]}")
        got[0] += 1

    run_epochs(loader, reference, compare)
    assert got[0] == len(expected) == 3


def test_iterable_longer_than_len_warns_like_torch() -> None:
    """An unsharded sized dataset yields more than len(): both warn, as often."""
    counts = []
    for cls in (TorchDataLoader, conveyor.DataLoader):
        loader = cls(ds.SizedUnshardedIterable(3), batch_size=1, num_workers=2)
        assert len(loader) == 3
        with pytest.warns(UserWarning, match="Length of IterableDataset") as record:
            batches = [b[0].tolist() for b in loader]
        assert batches == [[0], [0], [1], [1], [2], [2]], cls
        counts.append(sum("Length of IterableDataset" in str(w.message) for w in record))
    assert counts[1] == counts[0] == 3


def test_pin_memory_without_accelerator_warns_like_torch() -> None:
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: pinning is tested elsewhere")
    results = []
    for cls in (TorchDataLoader, conveyor.DataLoader):
        loader = cls(ds.MapDataset(5), batch_size=2, num_workers=1, pin_memory=True)
        with pytest.warns(UserWarning, match="no accelerator is found"):
            results.append([b["a"] for b in loader])
    assert_batches_equal(results[1], results[0])


def test_unordered_dispatch_routes_around_a_slow_worker(tmp_path: Path) -> None:
    """Sample 0 stalls worker 0 until sample 9 is fetched: torch sends every later task
    to worker 1 (one sent to worker 0 would wait behind sample 0, which waits for it)."""
    expected = {(0, 0), (2, 0)} | {(i, 1) for i in (1, 3, 4, 5, 6, 7, 8, 9)}
    for cls in (TorchDataLoader, conveyor.DataLoader):
        with Mailbox(tmp_path / f"{cls.__module__}-last-fetched") as box:
            dataset = ds.SlowFirstDataset(box.path)
            loader = cls(dataset, batch_size=None, num_workers=2, in_order=False)
            got = {(int(i), int(worker)) for i, worker in loader}
        assert got == expected, f"{cls.__module__}: (index, worker) {sorted(got)}"


def test_conjugate_view_arrives_with_its_values() -> None:
    """torch in-process gives the conjugated values (torch's workers drop the bit)."""
    kwargs = dict(batch_size=2, collate_fn=ds.collate_conj)
    expected = list(TorchDataLoader(ds.MapDataset(4), **kwargs))
    got = list(conveyor.DataLoader(ds.MapDataset(4), num_workers=1, **kwargs))
    assert_batches_equal([t.resolve_conj() for t in got], expected)


def test_views_from_collate_fn_keep_layout_like_torch() -> None:
    kwargs = dict(batch_size=2, num_workers=1, collate_fn=ds.collate_views)
    (expected,) = list(TorchDataLoader(ds.MapDataset(2), **kwargs))
    (got,) = list(conveyor.DataLoader(ds.MapDataset(2), **kwargs))
    assert_batches_equal(got, expected)  # strides
    base, row = got["alias"]
    base[0, 0] = -1.0
    assert row[0] == -1.0, "the two tensors no longer share storage"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_prefetch_factor_zero_fails_like_torch() -> None:
    kwargs = dict(batch_size=3, num_workers=2, prefetch_factor=0)
    expected = type(_raised(lambda: iter(TorchDataLoader(ds.MapDataset(6), **kwargs))))
    gc.collect()  # torch's half-built iterator complains in __del__: let it do so here
    assert expected is AssertionError, expected
    got = _raised(lambda: list(conveyor.DataLoader(ds.MapDataset(6), **kwargs)))
    assert isinstance(got, expected), f"conveyor raised {got!r}"


# --- argument validation --------------------------------------------------------------


def _raised(fn: Callable[[], Any]) -> BaseException | None:
    try:
        fn()
    except Exception as exc:
        return exc
    return None


BAD_ARGUMENTS = [
    ("negative-num-workers", mapped(), {"num_workers": -1}),
    ("negative-timeout", mapped(), {"timeout": -1}),
    ("prefetch-without-workers", mapped(), {"prefetch_factor": 2}),
    ("negative-prefetch", mapped(), {"num_workers": 1, "prefetch_factor": -1}),
    ("persistent-without-workers", mapped(), {"persistent_workers": True}),
    ("sampler-and-shuffle", mapped(), {"sampler": [0, 1], "shuffle": True}),
    ("batch-sampler-and-batch-size", mapped(), {"batch_sampler": [[0]], "batch_size": 2}),
    ("batch-sampler-and-shuffle", mapped(), {"batch_sampler": [[0]], "shuffle": True}),
    ("batch-sampler-and-sampler", mapped(), {"batch_sampler": [[0]], "sampler": [0]}),
    ("batch-sampler-and-drop-last", mapped(), {"batch_sampler": [[0]], "drop_last": True}),
    ("batch-size-none-and-drop-last", mapped(), {"batch_size": None, "drop_last": True}),
    ("batch-size-zero", mapped(), {"batch_size": 0}),
    ("batch-size-negative", mapped(), {"batch_size": -3}),
    ("drop-last-not-bool", mapped(), {"drop_last": "yes"}),
    ("shuffle-empty-dataset", mapped(0), {"shuffle": True}),
    ("iterable-and-shuffle", sharded(), {"shuffle": True}),
    ("iterable-and-sampler", sharded(), {"sampler": [0, 1]}),
    ("iterable-and-batch-sampler", sharded(), {"batch_sampler": [[0, 1]]}),
    ("bad-context-string", mapped(), {"num_workers": 1, "multiprocessing_context": "threads"}),
    ("bad-context-type", mapped(), {"num_workers": 1, "multiprocessing_context": 3}),
    ("context-without-workers", mapped(), {"multiprocessing_context": "fork"}),
]


@pytest.mark.parametrize(
    ("dataset", "kwargs"), [pytest.param(d, k, id=i) for i, d, k in BAD_ARGUMENTS]
)
def test_bad_arguments_raise_like_torch(dataset: Callable[[], Any], kwargs: dict[str, Any]) -> None:
    expected = _raised(lambda: TorchDataLoader(dataset(), **kwargs))
    assert expected is not None, f"torch accepts {kwargs}: fix the table"
    got = _raised(lambda: conveyor.DataLoader(dataset(), **kwargs))
    assert isinstance(got, type(expected)), (
        f"conveyor raised {got!r}, torch raised {type(expected).__name__}: {expected}"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("batch_size", 4),
        ("batch_sampler", None),
        ("sampler", [0]),
        ("drop_last", True),
        ("dataset", [1, 2]),
        ("persistent_workers", True),
        ("multiprocessing_context", "threads"),
        ("multiprocessing_context", 3),
    ],
)
def test_setting_attributes_after_init_like_torch(name: str, value: Any) -> None:
    errors = []
    for cls in (TorchDataLoader, conveyor.DataLoader):
        loader = cls(ds.MapDataset(4), batch_size=2, num_workers=1)
        errors.append(_raised(lambda loader=loader: setattr(loader, name, value)))
    expected, got = errors
    assert expected is not None, f"torch allows setting {name}: fix the table"
    assert isinstance(got, type(expected)), f"conveyor raised {got!r}, torch {expected!r}"


def test_allowed_attribute_changes_like_torch() -> None:
    for cls in (TorchDataLoader, conveyor.DataLoader):
        loader = cls(ds.MapDataset(4), batch_size=2, num_workers=1)
        loader.multiprocessing_context = "fork"
        loader.num_workers = 0
        assert [b["index"].tolist() for b in loader] == [[0, 1], [2, 3]], cls


PUBLIC_ATTRIBUTES = (
    "batch_size",
    "drop_last",
    "num_workers",
    "prefetch_factor",
    "timeout",
    "pin_memory",
    "pin_memory_device",
    "persistent_workers",
    "in_order",
    "generator",
    "worker_init_fn",
    "multiprocessing_context",
)


@pytest.mark.parametrize(
    ("dataset", "kwargs"),
    [
        pytest.param(mapped(), {}, id="defaults"),
        pytest.param(mapped(), {"batch_size": None}, id="bs-None"),
        pytest.param(mapped(), {"shuffle": True, "num_workers": 2}, id="shuffle-w2"),
        pytest.param(mapped(), {"batch_sampler": [[0, 1]]}, id="batch-sampler"),
        pytest.param(
            mapped(),
            {"sampler": [1, 2], "batch_size": 2, "drop_last": True, "num_workers": 1,
             "prefetch_factor": 3, "persistent_workers": True, "multiprocessing_context": "fork"},
            id="everything",
        ),
        pytest.param(sharded(), {"batch_size": 3}, id="iterable"),
    ],
)  # fmt: skip
def test_public_attributes_like_torch(dataset: Callable[[], Any], kwargs: dict[str, Any]) -> None:
    data = dataset()
    loaders = [cls(data, **kwargs) for cls in (TorchDataLoader, conveyor.DataLoader)]
    for name in PUBLIC_ATTRIBUTES:
        expected, got = (getattr(loader, name) for loader in loaders)
        assert got == expected, f"loader.{name}: {got!r} (conveyor) != {expected!r} (torch)"
    for name in ("sampler", "batch_sampler"):
        expected, got = (type(getattr(loader, name)).__name__.lstrip("_") for loader in loaders)
        assert got == expected, f"type(loader.{name}): {got} (conveyor) != {expected} (torch)"
    assert loaders[1].dataset is data


# --- thread workers -----------------------------------------------------------------


def _thread_case(param: Any) -> Any:
    """A table case with conveyor's workers as threads, or None where threads cannot
    give torch's batches by design: a dataset drawing from the process-wide ``random``,
    NumPy or torch generators (threads share them: draw from
    ``get_worker_info().rng`` instead), or a start method asked for."""
    (original,) = param.values
    torch_kwargs = original.kwargs("torch")
    if not torch_kwargs.get("num_workers") or "multiprocessing_context" in torch_kwargs:
        return None
    if torch_kwargs.get("worker_init_fn") is ds.reseed_numpy_worker_init:
        return None
    dataset = original.dataset()
    if isinstance(dataset, ds.RandomDataset) or getattr(dataset, "random_values", False):
        return None

    def kwargs(side: str) -> dict[str, Any]:
        extra = {"worker_method": "thread"} if side == "conveyor" else {}
        return {**original.kwargs(side), **extra}

    threaded = Case(original.dataset, kwargs, original.conveyor_dataset, original.epochs,
                    original.stop_after)  # fmt: skip
    return pytest.param(threaded, id=f"threads-{param.id}", marks=param.marks)


def thread_cases() -> list[Any]:
    table = [
        *batch_size_cases(),
        *sample_type_cases(),
        *collate_cases(),
        *dataset_type_cases(),
        *sampler_cases(),
        *iterable_cases(),
        *worker_cases(),
        *epoch_cases(),
    ]
    return [threaded for param in table if (threaded := _thread_case(param)) is not None]


@pytest.mark.parametrize("case", thread_cases())
def test_thread_workers_give_torchs_batches(case: Case) -> None:
    check_parity(case)


# --- Ray workers ---------------------------------------------------------------------

# A subset of the table, each axis once (Ray workers start actors: ~1 s a case). They own
# their processes, so datasets drawing from the process-wide generators are in.
RAY_SUBSET = (
    "bs3-drop1-w2", "nested-bs3-w2", "dtypes-bsNone-w1", "collate-numpy-w2", "getitems-w2",
    "worker-init-reseed-w2", "shuffle-generator-w2", "conveyor-info-sharded-bs5-drop-w3",
    "empty-shard-w3", "random-prefetch1-w3-bsNone", "unordered-shuffle-w2",
    "persistent-break-epoch1-w3-prefetch1",
)  # fmt: skip


def ray_cases() -> list[Any]:
    """:data:`RAY_SUBSET` with conveyor's workers as Ray actors (tests/remote runs them on a
    cluster of several nodes)."""
    table = [
        *batch_size_cases(),
        *sample_type_cases(),
        *collate_cases(),
        *dataset_type_cases(),
        *sampler_cases(),
        *iterable_cases(),
        *worker_cases(),
        *epoch_cases(),
    ]
    chosen = []
    for param in table:
        if param.id not in RAY_SUBSET:
            continue
        (original,) = param.values

        def kwargs(side: str, original: Case = original) -> dict[str, Any]:
            extra = {"worker_method": "ray"} if side == "conveyor" else {}
            return {**original.kwargs(side), **extra}

        remote = Case(original.dataset, kwargs, original.conveyor_dataset, original.epochs,
                      original.stop_after)  # fmt: skip
        chosen.append(pytest.param(remote, id=f"ray-{param.id}", marks=param.marks))
    assert len(chosen) == len(RAY_SUBSET), "a RAY_SUBSET id is not in the table"
    return chosen


# --- worker processes running cores in threads (threads_per_worker) ------------------

# Each axis of the thread workers' table once (the cores of a process are thread
# workers behind process workers' transport: the table runs whole for each of those).
CORES_SUBSET = (
    "bs3-drop1-w2", "nested-bs3-w2", "collate-numpy-w2", "getitems-w2",
    "shuffle-generator-w2", "conveyor-info-sharded-bs5-drop-w3", "empty-shard-w3",
    "unordered-shuffle-w2", "persistent-sharded-break",
)  # fmt: skip


def cores_cases() -> list[Any]:
    """:data:`CORES_SUBSET` with conveyor's ``num_workers`` processes of 2 cores each,
    against torch with as many workers as conveyor has cores (``2 * num_workers``):
    sharding, order and batches must be those of torch's ``2 * num_workers`` workers."""
    chosen = []
    for param in thread_cases():
        (threaded,) = param.values
        base_id = param.id.removeprefix("threads-")
        if base_id not in CORES_SUBSET:
            continue

        def kwargs(side: str, threaded: Case = threaded) -> dict[str, Any]:
            given = dict(threaded.kwargs(side))
            if side == "conveyor":
                given["worker_method"] = "multiprocessing"
                given["threads_per_worker"] = 2
            else:
                given["num_workers"] = 2 * given["num_workers"]
            return given

        cores = Case(threaded.dataset, kwargs, threaded.conveyor_dataset, threaded.epochs,
                     threaded.stop_after)  # fmt: skip
        chosen.append(pytest.param(cores, id=f"cores-{base_id}", marks=param.marks))
    missing = set(CORES_SUBSET) - {p.id.removeprefix("cores-") for p in chosen}
    assert not missing, f"CORES_SUBSET ids not in the thread workers' table: {missing}"
    return chosen


@pytest.mark.parametrize("case", cores_cases())
def test_cores_in_threads_give_torchs_batches(case: Case) -> None:
    check_parity(case)


# --- a fourth kind of worker: a shell and one registration ------------------------------


def fake_cases() -> list[Any]:
    """The thread workers' table, with the loop's fake pool registered as a kind of
    worker (tests/helpers/fake_kind.py): its cores share this process as threads do, one
    task at a time in the test's thread."""
    chosen = []
    for param in thread_cases():
        (threaded,) = param.values

        def kwargs(side: str, threaded: Case = threaded) -> dict[str, Any]:
            given = dict(threaded.kwargs(side))
            if side == "conveyor":
                given["worker_method"] = FAKE.name
            return given

        fake = Case(threaded.dataset, kwargs, threaded.conveyor_dataset, threaded.epochs,
                    threaded.stop_after)  # fmt: skip
        base_id = param.id.removeprefix("threads-")
        chosen.append(pytest.param(fake, id=f"fake-kind-{base_id}", marks=param.marks))
    return chosen


@pytest.fixture
def fake_kind() -> Iterator[None]:
    with registered():
        yield


@pytest.mark.parametrize("case", fake_cases())
def test_a_kind_of_worker_made_of_a_shell_and_one_registration_gives_torchs_batches(
    case: Case, fake_kind: None
) -> None:
    check_parity(case)
