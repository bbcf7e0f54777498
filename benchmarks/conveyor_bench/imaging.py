"""The ``decode`` workload's image work, with Pillow: making JPEGs, and decoding one into a
training crop. Kept out of :mod:`conveyor_bench.workloads` so that module imports only
NumPy, and a missing Pillow fails the ``decode`` row alone, saying how to install it.
"""

from __future__ import annotations

import functools
import io
import math
import random
from typing import Any

import numpy as np
import numpy.typing as npt

try:
    from PIL import Image
except ImportError as exc:  # the decode row says so; every other row runs
    raise ImportError(
        f"the decode workload needs Pillow, which this Python cannot import ({exc}). "
        "Install it with: pip install pillow"
    ) from exc

PHOTO_SIZE = (500, 375)  # an average ImageNet photo's size (width, height)
CROP = 224
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)


def crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (scale (0.08, 1), ratio (3/4, 4/3)),
    drawn from Python's ``random``: ``(left, top, right, bottom)`` in pixels."""
    area = width * height
    log_ratio = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
    for _ in range(10):
        target_area = area * random.uniform(*CROP_SCALE)
        aspect = math.exp(random.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = random.randint(0, height - h)
            left = random.randint(0, width - w)
            return left, top, left + w, top + h
    # After 10 misses, torchvision takes the largest central crop within the ratios.
    in_ratio = width / height
    if in_ratio < CROP_RATIO[0]:
        w, h = width, round(width / CROP_RATIO[0])
    elif in_ratio > CROP_RATIO[1]:
        w, h = round(height * CROP_RATIO[1]), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def _photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo-like picture: smooth colour gradients, mid-sized blotches and sensor-like
    noise, so its JPEG has a real photo's entropy (~60 KB at 500x375), not a flat colour's."""
    gradient = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    blotches = rng.integers(0, 256, (max(height // 12, 1), max(width // 12, 1), 3), np.uint8)
    smooth = Image.fromarray(gradient).resize((width, height), Image.Resampling.BICUBIC)
    detail = Image.fromarray(blotches).resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(smooth, np.int16) * 3 // 4 + np.asarray(detail, np.int16) // 4
    pixels += rng.integers(-14, 15, pixels.shape, dtype=np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


@functools.lru_cache(maxsize=4)
def make_jpegs(
    count: int, size: tuple[int, int] = PHOTO_SIZE, seed: int = 0, quality: int = 90
) -> tuple[bytes, ...]:
    """``count`` different JPEG files in memory (every fourth one upright), made once per
    process for the same arguments (~13 ms each at 500x375)."""
    rng = np.random.default_rng(seed)
    jpegs = []
    for number in range(count):
        width, height = size if number % 4 else size[::-1]
        buffer = io.BytesIO()
        _photo(rng, width, height).save(buffer, format="JPEG", quality=quality)
        jpegs.append(buffer.getvalue())
    return tuple(jpegs)


def decode_crop_flip(jpeg: bytes) -> npt.NDArray[Any]:
    """Decode ``jpeg``, crop a random box (torchvision's ``RandomResizedCrop``), resize it
    to 224x224 (bilinear, antialiased, as torchvision does with Pillow), flip it
    left-right with probability 1/2 (``RandomHorizontalFlip``); as a CHW uint8 array.
    The draws come from Python's ``random``: the crop's, then the flip's."""
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    box = crop_box(*image.size)
    image = image.resize((CROP, CROP), Image.Resampling.BILINEAR, box=box)
    if random.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    # A new, writable array (torch warns on read-only ones), as torchvision's PILToTensor
    # makes it; HWC -> CHW as its permute, a view.
    return np.array(image).transpose(2, 0, 1)
