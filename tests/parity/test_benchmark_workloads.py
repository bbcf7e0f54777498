"""The benchmark's training-like workloads give the same batches through conveyor and
torch: the same values, keys and shapes, and the same random crops and flips (``decode``
draws them from Python's ``random``, which both seed per worker from the loader's seed).
Small sizes: the point is the batches, not the speed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conveyor_bench import WORKLOADS
from conveyor_bench.workloads import BigDataset, FreshImageDataset, TextDataset

from .test_torch_parity import Case, check_parity

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]


def _decode() -> Any:
    imaging = pytest.importorskip("conveyor_bench.imaging")
    from conveyor_bench.workloads import DecodeDataset

    return DecodeDataset(12, imaging.make_jpegs(5, (80, 60)))


DATASETS: dict[str, Callable[[], Any]] = {
    "fresh": lambda: FreshImageDataset(12, pool=3),
    "decode": _decode,
    "text": lambda: TextDataset(12, pool=4096),
    "big": lambda: BigDataset(12, batch_size=4, mib=(1, 3)),
}


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("workload", list(DATASETS))
def test_workload_batches_equal_torchs(workload: str, method: str) -> None:
    spec = WORKLOADS[workload]
    extra = {} if spec.collate_fn is None else {"collate_fn": spec.collate_fn}
    case = Case(
        DATASETS[workload],
        lambda side: {
            "batch_size": 4,
            "num_workers": 2,
            "multiprocessing_context": method,
            **extra,
        },
    )
    check_parity(case)


def test_decode_batches_equal_torchs_without_workers() -> None:
    # In the main process both draw from the generators seeded by the test.
    check_parity(Case(_decode, lambda side: {"batch_size": 4}))
