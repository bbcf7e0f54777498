"""A user type, its dataset and collate functions for the ``default_collate_fn_map`` tests.

Importing this module registers nothing: each test registers what it needs and
puts both maps back afterwards (see ``collate_maps`` in the tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import collate

from .datasets import Point


class Box:
    """A type default_collate cannot batch by itself."""

    def __init__(self, value: Any, label: int) -> None:
        self.value = value
        self.label = label


class SubBox(Box):
    """Found through ``isinstance`` when only :class:`Box` is registered."""


class Boxes(NamedTuple):
    values: Any
    labels: list[int]


class BoxDataset(Dataset):
    """Boxes at the top of a sample and inside a dict, a tuple, a namedtuple and a list,
    next to the leaves torch's own rules handle (arrays, tensors, numbers, strings)."""

    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        kind = SubBox if i % 3 == 1 else Box
        return {
            "box": kind(np.arange(3, dtype=np.float32) + i, i),
            "pair": (Box(torch.tensor([i, -i]), i), i / 4),
            "point": Point(x=i, y=Box(np.int64(i), -i)),
            "boxes": [Box(float(i), i), Box(i, 2 * i)],
            "array": np.full((2,), i, np.int16),
            "tensor": torch.arange(2) + i,
            "number": i * 0.5,
            "name": f"s{i}",
            "raw": f"b{i}".encode(),
        }


def collate_boxes(batch: list[Box], *, collate_fn_map: Any = None) -> Boxes:
    """Collates what the boxes hold through the map it is given, as torch documents."""
    values = collate([b.value for b in batch], collate_fn_map=collate_fn_map)
    return Boxes(values, [b.label for b in batch])


def collate_boxes_numpy(batch: list[Box], *, collate_fn_map: Any = None) -> Any:
    """NumPy out: it must arrive as NumPy, not as the tensor default_collate would make."""
    return {"values": np.stack([np.asarray(b.value) for b in batch]), "first": np.int64(0)}


def collate_boxes_labels(batch: list[Box], *, collate_fn_map: Any = None) -> list[int]:
    return [b.label for b in batch]


def collate_float32(batch: list[float], *, collate_fn_map: Any = None) -> Any:
    """Replaces torch's rule for floats (float64)."""
    return torch.tensor(batch, dtype=torch.float32)


def collate_tensors_counted(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    """Replaces torch's rule for tensors: torch's rule for arrays then leads here too."""
    return (torch.stack(batch), len(batch))


def collate_mappings(batch: list[Mapping[Any, Any]], *, collate_fn_map: Any = None) -> Any:
    """Registered for ``Mapping``: found by ``isinstance`` for every dict."""
    return {"keys": sorted(map(str, batch[0])), "n": len(batch)}


def collate_objects(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    """Registered for ``object``: after torch's leaf types, before its containers."""
    return f"{type(batch[0]).__name__} x{len(batch)}"
