"""Datasets for the resume tests (importable, so spawn and forkserver workers load them).

torch is optional: without it the draws from torch are 0.0, generators are NumPy's and
batches hold NumPy arrays, and the tests check the same things of them.
"""

from __future__ import annotations

import os
import random
import signal
from typing import Any

import numpy as np

from conveyor import IterableDataset, get_worker_info

try:
    import torch
except ImportError:
    torch = None  # type: ignore[assignment]


def seeded(seed: int) -> Any:
    """A seeded generator for a loader: torch's when torch is there, else NumPy's."""
    if torch is None:
        return np.random.default_rng(seed)
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def draw_torch() -> float:
    """A draw from torch's global generator (0.0 without torch)."""
    return float(torch.rand(()).item()) if torch is not None else 0.0


class Draws:
    """Sample ``i`` is ``(i, a draw from random, one from NumPy, one from torch)``: what
    an augmentation sees. ``kill_at``: SIGKILL the worker fetching that index, the
    first time only (a marker file remembers). ``fail_at``: raise for that index."""

    def __init__(
        self, n: int = 40, kill_at: int | None = None, marker: str = "", fail_at: int = -1
    ) -> None:
        self.n = n
        self.kill_at = kill_at
        self.marker = marker
        self.fail_at = fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float, float, float]:
        if i == self.kill_at and get_worker_info() is not None and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.fail_at:
            raise ValueError(f"sample {i} is corrupt")
        return (i, random.random(), float(np.random.rand()), draw_torch())


class Counting(IterableDataset):  # type: ignore[type-arg]
    """Each worker yields its share of ``range(n)``; its position is its state."""

    def __init__(self, n: int = 30) -> None:
        self.n = n
        self.start = 0

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid, count = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = list(range(self.n))[wid::count]
        while self.start < len(mine):
            self.start += 1
            yield mine[self.start - 1]
        self.start = 0

    def state_dict(self) -> dict[str, int]:
        return {"start": self.start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["start"]


def plain(batch: Any) -> Any:
    """A batch as nested Python values (tensors and arrays as lists), for comparing runs."""
    if isinstance(batch, (np.ndarray, np.generic)) or (
        torch is not None and isinstance(batch, torch.Tensor)
    ):
        return batch.tolist()
    if isinstance(batch, (list, tuple)):
        return [plain(b) for b in batch]
    if isinstance(batch, dict):
        return {k: plain(v) for k, v in batch.items()}
    return batch
