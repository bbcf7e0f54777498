"""Datasets whose samples or batches hold nothing: zero-length arrays and tensors, and
batches of zero rows. NumPy only at import (spawned workers stay torch-free for the
NumPy ones); the tensor samples import torch when fetched.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LENGTH = 256


class EmptyArrays:
    """NumPy leaves of zero length next to ordinary ones."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "vec": np.zeros(0, dtype=np.float32),
            "mat": np.zeros((0, 3), dtype=np.int64),
            "label": i,
        }


class EmptyTensors:
    """torch leaves of zero length (and one zero-width image)."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, i: int) -> Any:
        import torch

        return (torch.zeros(0), torch.zeros(3, 0, 2, dtype=torch.uint8), torch.tensor(i))


def zero_rows(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A collate_fn whose batch has zero rows: the samples all filtered out, say (a
    tensor among them where torch is installed)."""
    kept = [s["label"] for s in samples if s["label"] < 0]
    try:
        import torch
    except ImportError:
        last: Any = np.zeros((len(kept), 4), dtype=np.int16)
    else:
        last = torch.zeros(len(kept), 4, dtype=torch.int16)
    return {
        "ids": np.asarray(kept, dtype=np.int64),
        "rows": np.zeros((len(kept), 4), dtype=np.float32),
        "t": last,
    }


def arrays() -> EmptyArrays:
    return EmptyArrays()


def tensors() -> EmptyTensors:
    return EmptyTensors()


def zero_row_loader() -> Any:
    from conveyor import DataLoader

    return DataLoader(EmptyArrays(), batch_size=16, collate_fn=zero_rows)
