"""Datasets that never import torch themselves, for the torch-free worker tests.

Kept in a module of their own: a worker unpickling them imports this module,
and it must not pull torch in.
"""

from __future__ import annotations

import random
import sys
from collections import namedtuple

import numpy as np

Pair = namedtuple("Pair", ["left", "right"])


class Mixed:
    """Every leaf kind default_collate handles, uniform within a batch."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        return {
            "vec": np.arange(4, dtype=np.float32) + i,
            "img": np.full((2, 3), i, dtype=np.uint8),
            "int": i,
            "float": i / 3,
            "bool": i % 2 == 0,
            "np_scalar": np.float32(i) / 2,
            "text": f"s{i}",
            "pair": Pair(i, (i, -i)),
            "nested": [{"a": np.int16(i)}, (np.array([i, i]),)],
        }


class NeedsTorchRules:
    """Leaves where NumPy's rules differ from torch's: the worker must defer to torch."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict:
        return {
            "int_or_float": i + 0.5 if i % 2 else i,  # int first: torch float32, NumPy float64
            "mixed_scalars": np.float32(i) if i % 2 else np.float64(i),
        }


class Randoms:
    """Draws from every RNG; torch only if asked, and imported lazily."""

    def __init__(self, use_torch: bool) -> None:
        self.use_torch = use_torch

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        out = {"py": random.random(), "np": float(np.random.rand())}
        if self.use_torch:
            import torch  # lazily: the worker must seed it on import

            out["torch"] = float(torch.rand(1))
        return out


class TorchPresence:
    """Reports whether the worker process has imported torch."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return {"torch_loaded": "torch" in sys.modules, "x": np.zeros(2)}


class Unbatched:
    """For batch_size=None: default_convert's rules (tuples become lists)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple:
        return (np.arange(3) * i, np.float64(i), i, "s", np.array(["a", "b"]))


class MixedArrays:
    """Arrays of different dtypes in one batch: torch promotes (in-process)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        return np.ones(3, dtype=np.float32 if i % 2 else np.int64) * i


def collate_via_default(batch: list) -> dict:
    """A user's own collate_fn that delegates to conveyor's default_collate."""
    from conveyor import default_collate

    return {"wrapped": default_collate(batch)}


class Tag:
    """A user type collated by a function the worker registers (see register_tags)."""

    def __init__(self, code: int) -> None:
        self.code = code


class Tagged:
    """Samples whose tags only a registered collate function can batch."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict:
        return {"vec": np.arange(3, dtype=np.float32) + i, "tag": Tag(i), "n": i}


def collate_tags(batch: list, *, collate_fn_map: object = None) -> np.ndarray:
    """NumPy out: it must reach the main process as NumPy, not as a tensor."""
    return np.array([t.code for t in batch], dtype=np.int32)


def register_tags_with_conveyor(worker_id: int) -> None:
    """worker_init_fn: a registration made in the worker, in conveyor's map (no torch)."""
    from conveyor.collate import default_collate_fn_map

    default_collate_fn_map[Tag] = collate_tags


def register_tags_with_torch(worker_id: int) -> None:
    """The same registration for torch's own loader (its worker has torch)."""
    from torch.utils.data._utils.collate import default_collate_fn_map

    default_collate_fn_map[Tag] = collate_tags
