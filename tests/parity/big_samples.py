"""Samples whose arrays and tensors are large enough to be written into their rows one by
one (streaming collate, conveyor/_collate_rows.py), for its unit and parity tests.

Module-level and importable, so torch's DataLoader and spawned workers pickle them by
reference. Every leaf that streams is at least 16 KiB (``STREAM_MIN_BYTES``).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .datasets import Point

KINDS = (
    "tuple",
    "dict",
    "namedtuple",
    "list",
    "nested",
    "tensors",
    "dtypes",
    "mapping_types",
)
IMAGE = (3, 48, 48)  # float32: 27 KiB


def image(i: int, dtype: Any = np.float32, shape: tuple[int, ...] = IMAGE) -> np.ndarray:
    return np.full(shape, i % 251, dtype=dtype) + np.arange(shape[-1], dtype=dtype)


def make_big(kind: str, i: int) -> Any:
    if kind == "tuple":
        return image(i), i
    if kind == "dict":
        return {
            "image": image(i, np.uint8, (3, 96, 96)),
            "label": i,
            "name": f"s{i}",
            "weight": i / 4,
            "mask": np.full((128, 128), i % 2 == 0),
        }
    if kind == "namedtuple":
        return Point(x=torch.full((80, 64), float(i)), y=np.float64(i) * 1.5)
    if kind == "list":
        return [np.arange(5000, dtype=np.int64) + i, [image(i, np.float64), i], True]
    if kind == "nested":
        return {
            "items": [{"a": i, "b": image(i)}, {"a": -i, "b": image(-i)}],
            "meta": {"name": str(i), "t": torch.arange(8192, dtype=torch.int32) + i},
            "pair": (Point(i, float(i)), [True, i > 4]),
        }
    if kind == "tensors":
        return torch.arange(8192) + i, torch.full((128, 80), float(i), dtype=torch.float16)
    if kind == "dtypes":
        return {
            "bool": np.arange(20000) % (i + 2) == 0,
            "complex": np.full(2048, 1j * i, np.complex128),
            "uint16": torch.full((9000,), i, dtype=torch.uint16),
            "bfloat16": torch.full((9000,), i, dtype=torch.bfloat16),  # NumPy lacks it
        }
    if kind == "mapping_types":  # not written row by row: collated as before
        return OrderedDict([("z", i), ("image", image(i))])
    raise ValueError(f"unknown sample kind {kind!r}")


class BigDataset(Dataset):
    """``n`` samples of one ``kind`` (see :data:`KINDS`)."""

    def __init__(self, n: int = 10, kind: str = "tuple") -> None:
        self.n = n
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return make_big(self.kind, i)


class ChangingDataset(Dataset):
    """Big ``(image, label)`` samples, but sample ``at`` differs: ``"shape"`` (another
    shape: no batch can hold it), ``"dtype"`` (float64: the batch is promoted), ``"tensor"``
    (a tensor where the others hold arrays), ``"label"`` (a float label), ``"missing"``
    (a dict without its label, where the others are dicts) or ``"raise"`` (it raises)."""

    def __init__(self, change: str, at: int = 6, n: int = 12) -> None:
        self.change = change
        self.at = at
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        value, label = image(i), i
        changed = i == self.at
        if self.change == "missing":
            return {"image": value} if changed else {"image": value, "label": label}
        if not changed:
            return value, label
        if self.change == "shape":
            return image(i, shape=(3, 48, 40)), label
        if self.change == "dtype":
            return image(i, np.float64), label
        if self.change == "tensor":
            return torch.from_numpy(value), label
        if self.change == "label":
            return value, label + 0.5
        if self.change == "raise":
            raise ValueError(f"sample {i} is broken")
        raise ValueError(f"unknown change {self.change!r}")


class HoldDataset(Dataset):
    """Big samples that say whether the previous sample's array was still alive when this
    one was fetched: written into its row and dropped, it is not (streaming collate);
    kept until the batch is whole, it is."""

    def __init__(self, n: int = 12) -> None:
        self.n = n
        self._last: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        held = self._last is not None and self._last() is not None
        value = image(i)
        self._last = weakref.ref(value)
        return value, held
