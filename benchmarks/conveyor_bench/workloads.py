"""Benchmark workloads: map-style datasets and the loader settings each one runs with.

The datasets are defined at module top level so that they pickle by reference under the
``spawn`` and ``forkserver`` start methods, and this module imports only NumPy, so a spawned
worker that unpickles one pays for nothing else (``decode`` imports Pillow, through
:mod:`conveyor_bench.imaging`, at its first sample). Every sample is a ``(value, label)``
tuple, except ``text``'s: a 1-D array of token ids, padded into a dict by ``pad_collate``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


class MapDataset(Protocol):
    """What the benchmark needs from a dataset: ``len(ds)`` and ``ds[i]``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


def _check_index(index: int, length: int) -> None:
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for a dataset of length {length}")


class Repeated:
    """``dataset``'s samples ``times`` over: room for a run that first waits for
    ``num_workers="auto"`` to settle (seconds of batches) and then times its window."""

    def __init__(self, dataset: MapDataset, times: int) -> None:
        self.dataset, self.times = dataset, times

    def __len__(self) -> int:
        return len(self.dataset) * self.times

    def __getitem__(self, index: int) -> Any:
        _check_index(index, len(self))
        return self.dataset[index % len(self.dataset)]


class TinyDataset:
    """Sample ``i``: (a float32 vector of 16 values, an int label); a row of a small table."""

    def __init__(self, length: int, rows: int = 1024) -> None:
        self.length = length
        self.table = np.random.default_rng(0).standard_normal((rows, 16), dtype=np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        return self.table[index % len(self.table)], index % 10


class ImageDataset:
    """Sample ``i``: (a 3x224x224 uint8 image, an int label), one of a few preallocated images.

    Fetching is nearly free, so the loader's own cost (collate, transfer) dominates.
    """

    shape = (3, 224, 224)

    def __init__(self, length: int, pool: int = 4) -> None:
        self.length = length
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, self.shape, dtype=np.uint8) for _ in range(pool)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        return self.images[index % len(self.images)], index % 1000


class FreshImageDataset(ImageDataset):
    """``image``'s sample, but a new array each time, as a decoded or augmented image is:
    the dataset, the loader and the allocator pay for fresh memory every sample."""

    def __init__(self, length: int, pool: int = 16) -> None:
        super().__init__(length, pool)

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        return self.images[index % len(self.images)].copy(), index % 1000


class FloatImageDataset(ImageDataset):
    """``image``'s sample as a float32 array, new each time (a 3x224x224 float32 sample,
    600 KB, as ``ToDtype(float32)`` makes it): batches of 64 are 38.5 MB."""

    def __init__(self, length: int, pool: int = 16) -> None:
        super().__init__(length, pool)

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        return self.images[index % len(self.images)].astype(np.float32), index % 1000


class DecodeDataset:
    """Sample ``i``: JPEG ``i % len(jpegs)`` decoded, randomly resized-cropped to 224x224,
    flipped half the time, as a 3x224x224 uint8 array; and an int label. The ImageNet
    training pipeline on the CPU (torchvision's ``RandomResizedCrop`` and
    ``RandomHorizontalFlip``, with Pillow and NumPy). The random draws come from Python's
    ``random``, which every worker seeds, so they are reproducible from the loader's seed.
    """

    def __init__(self, length: int, jpegs: Sequence[bytes]) -> None:
        self.length = length
        self.jpegs = list(jpegs)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        from conveyor_bench import imaging  # Pillow: imported by the first sample only

        return imaging.decode_crop_flip(self.jpegs[index % len(self.jpegs)]), index % 1000


VOCABULARY = 50_257  # GPT-2's
TEXT_LENGTHS = (16, 512)


class TextDataset:
    """Sample ``i``: a document of 16 to 512 int64 token ids (its length drawn once per
    index), a new array each time, as a tokenizer returns it. ``pad_collate`` pads a batch.
    """

    def __init__(self, length: int, pool: int = 1 << 20) -> None:
        self.length = length
        rng = np.random.default_rng(0)
        self.tokens = rng.integers(0, VOCABULARY, pool, dtype=np.int64)
        low, high = TEXT_LENGTHS
        self.lengths = rng.integers(low, high + 1, length)
        self.starts = rng.integers(0, pool - high, length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Array:
        _check_index(index, self.length)
        start = int(self.starts[index])
        return self.tokens[start : start + int(self.lengths[index])].copy()


def pad_collate(samples: Sequence[Array]) -> dict[str, Array]:
    """A language model's collate: pad the batch's documents to the longest one.

    ``input_ids`` are padded with 0, and ``attention_mask`` is 1 over each document's tokens.
    """
    return _pad(samples, np.zeros)


def pad_collate_shared(samples: Sequence[Array]) -> dict[str, Array]:
    """:func:`pad_collate`, its two arrays made with ``conveyor.collate.zeros``: in a
    conveyor worker, in the shared memory the batch travels in; anywhere else (in-process,
    torch's loader) NumPy's, so it does exactly :func:`pad_collate`'s work there."""
    from conveyor.collate import zeros

    return _pad(samples, zeros)


def _pad(samples: Sequence[Array], zeros: Callable[..., Array]) -> dict[str, Array]:
    longest = max(len(sample) for sample in samples)
    input_ids = zeros((len(samples), longest), dtype=np.int64)
    attention_mask = zeros((len(samples), longest), dtype=np.int64)
    for row, sample in enumerate(samples):
        input_ids[row, : len(sample)] = sample
        attention_mask[row, : len(sample)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


BIG_MIB = (64, 160)


class BigDataset:
    """Sample ``i``: a new float32 vector whose size depends on its batch, so that batches
    of ``batch_size`` samples are 64 to 160 MiB (``mib``), each a different size; and an
    int label."""

    def __init__(self, length: int, batch_size: int, mib: tuple[int, int] = BIG_MIB) -> None:
        self.length = length
        self.batch_size = batch_size
        self.mib = mib

    def __len__(self) -> int:
        return self.length

    def batch_mib(self, batch: int) -> int:
        """The size of batch number ``batch`` (in sampler order), within ``mib``."""
        low, high = self.mib
        return low + (batch * 37) % (high - low + 1)

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        values = self.batch_mib(index // self.batch_size) * 2**20 // 4 // self.batch_size
        return np.full(values, index % 251, dtype=np.float32), index % 10


def spin(iterations: int) -> int:
    """Pure-Python busy work (holds the GIL): ``iterations`` rounds of integer arithmetic."""
    acc = 0
    for j in range(iterations):
        acc = (acc + j * j) % 1_000_003
    return acc


def calibrate_spin(target_s: float = 0.001, trials: int = 7) -> int:
    """How many ``spin`` iterations take ``target_s`` on this machine (best of ``trials``)."""
    probe = 20_000
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        spin(probe)
        best = min(best, time.perf_counter() - start)
    return max(1, round(probe * target_s / best))


class CpuDataset:
    """Sample ``i``: ~1 ms of pure-Python work (``spin``), then an 8-float32 vector and a label.

    ``iterations`` comes from ``calibrate_spin`` in the main process, so each sample costs about
    the same wall time in every worker and in the plain loop.
    """

    def __init__(self, length: int, iterations: int) -> None:
        self.length = length
        self.iterations = iterations

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        acc = spin(self.iterations)
        return np.full(8, acc + index, dtype=np.float32), index % 10


class SleepDataset:
    """Sample ``i``: sleeps ``delay_s`` (I/O stand-in), then an 8-float32 vector and a label."""

    def __init__(self, length: int, delay_s: float = 0.005) -> None:
        self.length = length
        self.delay_s = delay_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Array, int]:
        _check_index(index, self.length)
        time.sleep(self.delay_s)
        return np.full(8, index, dtype=np.float32), index % 10


class PathListDataset:
    """A dataset holding a Python list of path strings; sample ``i``: (path, ``i``).

    Its pickle is large (tens of MB for 1M paths), which is what makes spawn startup slow.
    """

    def __init__(self, count: int) -> None:
        self.paths = [f"/data/train/{i:07d}.jpg" for i in range(count)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.paths[index], index


def hand_collate(samples: Sequence[tuple[Any, int]]) -> tuple[Any, Array]:
    """Collate by hand for the plain loop: stack the values (arrays) and the labels."""
    values = [value for value, _ in samples]
    labels = np.asarray([label for _, label in samples], dtype=np.int64)
    if isinstance(values[0], np.ndarray):
        return np.stack(values), labels
    return values, labels


DECODE_IMAGES = 256  # different JPEGs of 500x375; --quick: 16 small ones, 160x120
