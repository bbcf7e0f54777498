"""The dataset of test_heap_reuse, in a module of its own: a spawned worker imports
what the dataset's module imports, and importing the test module (pytest and all)
would set the worker's malloc thresholds by its own large frees, hiding the case."""

from __future__ import annotations

import resource

import numpy as np

SAMPLE_SHAPE = (3, 224, 224)  # an ImageNet crop: 150 KB, over glibc's first mmap threshold


class FreshImages:
    """A new array per sample (as a decode or an augmentation makes), and the worker's
    minor page faults so far."""

    def __init__(self, length: int) -> None:
        rng = np.random.default_rng(0)
        self.pool = [rng.integers(0, 255, SAMPLE_SHAPE, dtype=np.uint8) for _ in range(16)]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.pool[index % 16].copy(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
