"""Streaming collate against torch, batch by batch: samples large enough to be written into
their rows as they are fetched (conveyor/_collate_rows.py) give torch's batches for every
structure, in worker processes (fork, spawn, forkserver), thread workers and without
workers; so do batches where a sample does not fit (collated as before); skipping leaves
out exactly the failing sample; a collate error names the sample and the field."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import conveyor  # noqa: E402
from conveyor.errors import CollateKeyError, CollateShapeError  # noqa: E402

from . import big_samples as big  # noqa: E402
from .test_torch_parity import (  # noqa: E402
    Case,
    assert_batches_equal,
    case,
    check_parity,
    seed_everything,
)

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]

METHODS = ("fork", "spawn", "forkserver")


def big_dataset(kind: str, n: int = 10) -> Any:
    return lambda: big.BigDataset(n, kind)


def changing(change: str, at: int = 6) -> Any:
    return lambda: big.ChangingDataset(change, at)


def structure_cases() -> list[Any]:
    cases = [
        case(f"{kind}-fork-w2", big_dataset(kind), dict(batch_size=3, num_workers=2))
        for kind in big.KINDS
    ]
    for method in ("spawn", "forkserver"):  # workers that leave making tensors to us
        for kind in ("nested", "tensors", "dtypes"):
            options = dict(batch_size=4, num_workers=1, multiprocessing_context=method)
            cases.append(case(f"{kind}-{method}-w1", big_dataset(kind, 6), options))
    for kind in ("nested", "tensors"):
        cases.append(case(f"{kind}-w0", big_dataset(kind), dict(batch_size=3)))
    return cases


def _threads(side: str, options: dict[str, Any]) -> dict[str, Any]:
    return {**options, "worker_method": "thread"} if side == "conveyor" else options


@pytest.mark.parametrize("case", structure_cases())
def test_every_structure_gives_torchs_batches(case: Case) -> None:
    check_parity(case)


@pytest.mark.parametrize("kind", ["nested", "dtypes"])
def test_thread_workers_give_torchs_batches(kind: str) -> None:
    options = dict(batch_size=3, num_workers=2)
    check_parity(Case(big_dataset(kind), lambda side: _threads(side, options)))


@pytest.mark.parametrize(
    ("method", "change"),
    [("fork", "dtype"), ("fork", "tensor"), ("fork", "label")]
    + [(method, change) for method in ("spawn", "forkserver") for change in ("dtype", "tensor")],
)
def test_a_sample_that_does_not_fit_gives_torchs_batch(method: str, change: str) -> None:
    # Batches of 4 from 0: the changed sample (6) is in the middle of the second batch.
    options = dict(batch_size=4, num_workers=2, multiprocessing_context=method)

    def kwargs(side: str) -> dict[str, Any]:
        if change == "dtype" and side == "torch":
            # torch's workers cast the batch to the first sample's dtype (they stack into
            # a tensor made like it); without workers torch promotes, as conveyor always
            # does (before streaming too): compare with that.
            return dict(batch_size=4)
        return dict(options)

    check_parity(Case(changing(change), kwargs))


@pytest.mark.parametrize("method", METHODS)
def test_skipping_leaves_out_exactly_the_failing_sample(method: str) -> None:
    """conveyor skips sample 6, which raises; torch is given the same batches without it."""
    batches = [[0, 1, 2, 3], [4, 5, 7], [8, 9, 10, 11]]

    def options(side: str) -> dict[str, Any]:
        common = dict(num_workers=2, multiprocessing_context=method)
        if side == "conveyor":
            return {**common, "batch_size": 4, "on_error": "skip", "max_errors": 1}
        return {**common, "batch_sampler": batches}

    check_parity(Case(changing("raise"), options))


def _outcomes(loader: Any) -> list[Any]:
    """Each batch, or the exception raised in its place (the loop goes on after it)."""
    out: list[Any] = []
    iterator = iter(loader)
    while True:
        try:
            out.append(next(iterator))
        except StopIteration:
            return out
        except Exception as exc:
            out.append(exc)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("change", ["shape", "missing"])
def test_a_sample_changing_shape_mid_batch_is_named(method: str, change: str) -> None:
    options = dict(batch_size=4, num_workers=2, multiprocessing_context=method)
    seed_everything()
    expected = _outcomes(torch.utils.data.DataLoader(big.ChangingDataset(change), **options))
    seed_everything()
    got = _outcomes(conveyor.DataLoader(big.ChangingDataset(change), **options))
    assert len(got) == len(expected) == 3
    for position, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        if position != 1:
            assert_batches_equal(ours, theirs, f"batch {position}")
            continue
        assert isinstance(theirs, (RuntimeError, KeyError))
        assert isinstance(ours, type(theirs))  # what torch's users catch still works
        assert isinstance(ours, CollateShapeError if change == "shape" else CollateKeyError)
        assert "dataset index 6" in str(ours)
        assert ours.culprits == (6,)
        if change == "missing":
            assert "'label'" in str(ours)


@pytest.mark.parametrize(
    "options",
    [pytest.param(dict(num_workers=2, multiprocessing_context=m), id=m) for m in METHODS]
    + [
        pytest.param(dict(num_workers=2, worker_method="thread"), id="threads"),
        pytest.param(dict(num_workers=0), id="w0"),
    ],
)
def test_each_sample_is_dropped_once_written(options: dict[str, Any]) -> None:
    """Each sample says whether the one before was still alive when it was fetched: written
    into its row and dropped, it is not, whatever runs the task."""
    loader = conveyor.DataLoader(big.HoldDataset(12), batch_size=4, **options)
    held = [bool(x) for _, flags in loader for x in flags]
    assert held == [False] * 12
