"""Tasks and results flow whatever their sizes: neither side ever blocks writing
to a peer that is itself blocked writing.

Large tasks (thousands of indices) fill the task pipe; large results (a batch
copied through the pipe because the loop keeps every slot, or text batches,
which are pickled whole) fill the result pipe. Before the main process wrote
tasks without blocking, these configurations hung after 0 to 40 batches.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from conveyor import BatchesHeldWarning, DataLoader

pytestmark = pytest.mark.timeout(120)


class Floats:
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(64, index, dtype=np.float32)


class Texts:
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"text": f"sample number {index} " * 3, "label": index}


def _run(loader: DataLoader, keep: bool) -> list[int]:
    kept: list[Any] = []
    labels: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BatchesHeldWarning)  # keeping every batch: expected
        for batch in loader:
            if keep:
                kept.append(batch)
            labels += (
                batch["label"].tolist()
                if isinstance(batch, dict)
                else [int(row[0]) for row in batch]
            )
    return labels


@pytest.mark.parametrize(
    ("batch_size", "prefetch"),
    [
        (2048, 8),
        pytest.param(4096, 4, marks=pytest.mark.slow),
        pytest.param(1024, 16, marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("keep", [True, False], ids=["keeps-batches", "drops-batches"])
def test_big_array_batches_with_deep_prefetch_flow(
    batch_size: int, prefetch: int, keep: bool
) -> None:
    length = batch_size * 48
    loader = DataLoader(
        Floats(length),
        batch_size=batch_size,
        num_workers=2,
        prefetch_factor=prefetch,
        multiprocessing_context="fork",
    )
    assert _run(loader, keep) == list(range(length))


@pytest.mark.parametrize(
    ("batch_size", "prefetch"), [(4096, 8), pytest.param(8192, 4, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("keep", [True, False], ids=["keeps-batches", "drops-batches"])
def test_big_text_batches_with_deep_prefetch_flow(
    batch_size: int, prefetch: int, keep: bool
) -> None:
    length = batch_size * 24
    loader = DataLoader(
        Texts(length),
        batch_size=batch_size,
        shuffle=True,
        num_workers=2,
        prefetch_factor=prefetch,
        multiprocessing_context="fork",
    )
    assert sorted(_run(loader, keep)) == list(range(length))
