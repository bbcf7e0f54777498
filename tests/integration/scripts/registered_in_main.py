"""Collate functions registered in ``__main__``, for types defined there: conveyor's
spawned and forkserver workers honour them (they do not run ``__main__`` again; the
maps travel with the collate function), giving the batches torch gives under fork.

Usage: ``registered_in_main.py METHOD...``; prints ``ok`` when every batch matches.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data._utils.collate import collate, default_collate_fn_map

import conveyor
import conveyor.collate


class Token:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class Span:
    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop


class Tokens:
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "token": Token(list(range(i % 3 + 1))),
            "span": Span(i, i + 2),
            "image": np.full((2, 2), i, np.uint8),
            "label": i,
        }


def collate_tokens(batch: list[Token], *, collate_fn_map: Any = None) -> Any:
    width = max(len(t.ids) for t in batch)
    padded = np.zeros((len(batch), width), np.int64)  # stays NumPy: what torch gives
    for row, t in zip(padded, batch, strict=True):
        row[: len(t.ids)] = t.ids
    return {"ids": padded, "lengths": torch.tensor([len(t.ids) for t in batch])}


def collate_spans(batch: list[Span], *, collate_fn_map: Any = None) -> Any:
    return collate([(s.start, s.stop) for s in batch], collate_fn_map=collate_fn_map)


def same(a: Any, b: Any, where: str = "batch") -> None:
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where}: {a} != {b}"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{where}: {a} != {b}"
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


if __name__ == "__main__":
    default_collate_fn_map[Token] = collate_tokens
    default_collate_fn_map[Span] = collate_spans
    expected = list(TorchDataLoader(Tokens(), batch_size=4, num_workers=2))  # fork
    del default_collate_fn_map[Span]
    conveyor.collate.default_collate_fn_map[Span] = collate_spans  # conveyor's own map too
    for method in sys.argv[1:]:
        loader = conveyor.DataLoader(
            Tokens(), batch_size=4, num_workers=1, multiprocessing_context=method
        )
        got = list(loader)
        assert len(got) == len(expected) == 3, (method, len(got))
        for i, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
            same(ours, theirs, f"{method} batch {i}")
    print("ok")
