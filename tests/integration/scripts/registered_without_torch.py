"""conveyor's own ``default_collate_fn_map`` with torch's import blocked (see the test):
a new type, floats as float32, and an entry for a namedtuple, registered in
``__main__``, give NumPy batches in-process and from workers.

Usage: ``registered_without_torch.py METHOD`` (``inline`` for no workers); prints ``ok``.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

import conveyor
from conveyor.collate import collate, default_collate_fn_map


class Ragged:
    def __init__(self, values: list[int]) -> None:
        self.values = values


class Pair(NamedTuple):
    a: Any
    b: Any


class Samples:
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "ragged": Ragged(list(range(i + 1))),
            "x": i / 2,
            "pair": Pair(i, np.full(2, i, np.int16)),
            "nested": [Ragged([i]), {"y": float(i)}],
        }


def collate_ragged(batch: list[Ragged], *, collate_fn_map: Any = None) -> Any:
    return {
        "values": np.concatenate([r.values for r in batch]),
        "n": [len(r.values) for r in batch],
    }


def collate_float32(batch: list[float], *, collate_fn_map: Any = None) -> Any:
    return np.array(batch, np.float32)


def collate_pairs(batch: list[Pair], *, collate_fn_map: Any = None) -> Any:
    return ("pairs", collate([p.b for p in batch], collate_fn_map=collate_fn_map))


def check(batch: dict[str, Any], start: int) -> None:
    rows = range(start, start + 3)
    ragged = batch["ragged"]
    assert ragged["n"] == [i + 1 for i in rows], ragged
    assert ragged["values"].tolist() == [v for i in rows for v in range(i + 1)], ragged
    assert batch["x"].dtype == np.float32 and batch["x"].tolist() == [i / 2 for i in rows]
    tag, stacked = batch["pair"]
    assert tag == "pairs" and type(stacked) is np.ndarray and stacked.dtype == np.int16
    assert stacked.tolist() == [[i, i] for i in rows], stacked
    assert batch["nested"][0]["n"] == [1, 1, 1]
    y = batch["nested"][1]["y"]
    assert y.dtype == np.float32 and y.tolist() == list(map(float, rows)), y


if __name__ == "__main__":
    default_collate_fn_map[Ragged] = collate_ragged
    default_collate_fn_map[float] = collate_float32
    default_collate_fn_map[Pair] = collate_pairs
    method = sys.argv[1]
    options = {} if method == "inline" else {"num_workers": 2, "multiprocessing_context": method}
    batches = list(conveyor.DataLoader(Samples(), batch_size=3, **options))
    assert len(batches) == 2, batches
    for n, batch in enumerate(batches):
        check(batch, 3 * n)
    assert "torch" not in sys.modules
    print("ok")
