"""The ``torchvision`` workloads: torchvision's own ``ImageFolder`` and v2 random transforms,
the pipeline most vision training runs, over JPEG files on disk.

``torchvision``: each file decoded by Pillow (ImageFolder's default loader), then
``RandomResizedCrop(224)``, ``RandomHorizontalFlip``, ``ToImage``, ``ToDtype(float32)`` and
``Normalize``; ``torchvision-io``: the same with the file decoded by
``torchvision.io.decode_jpeg`` into a tensor. Kept out of :mod:`conveyor_bench.workloads`
(which imports only NumPy): without torchvision these rows say so and the run goes on.
The JPEGs are ``decode``'s photo-like pictures (:func:`conveyor_bench.imaging.make_jpegs`),
written once per process into a temporary folder of four classes.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from conveyor_bench.workloads import DECODE_IMAGES, Repeated

INSTALL = "pip install torch==2.14.1 torchvision==0.29.1"
CLASSES = 4
CROP = 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class NeedsTorchvision(ImportError):
    """The workload cannot run here: its row is skipped with this note, not failed."""

    skips_workload = True  # what the runner looks for (it imports no torchvision)


def _torchvision() -> Any:
    try:
        import torchvision
        from torchvision.transforms import v2  # noqa: F401  (0.15 and later)
    except ImportError as exc:
        raise NeedsTorchvision(f"needs torchvision ({exc}): {INSTALL}") from exc
    return torchvision


@functools.lru_cache(maxsize=2)
def _folder(count: int, size: tuple[int, int]) -> str:
    """A folder of ``count`` JPEGs in ``CLASSES`` class folders, removed at exit."""
    from conveyor_bench import imaging

    root = Path(tempfile.mkdtemp(prefix="conveyor-bench-images-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for number, jpeg in enumerate(imaging.make_jpegs(count, size)):
        label = root / f"class{number % CLASSES}"
        label.mkdir(exist_ok=True)
        (label / f"{number:05d}.jpg").write_bytes(jpeg)
    return str(root)


def decode_with_torchvision(path: str) -> Any:
    """ImageFolder's loader for ``torchvision-io``: the file decoded by torchvision's
    ``decode_jpeg`` into a CHW uint8 RGB tensor."""
    from torchvision import io

    return io.decode_jpeg(io.read_file(path), mode=io.ImageReadMode.RGB)


def image_folder(length: int, quick: bool, *, torchvision_io: bool = False) -> Repeated:
    """``length`` samples or more of an ImageFolder with v2 random transforms (its files
    over again); ``quick``: 16 small files, as ``decode``'s quick run."""
    torchvision = _torchvision()
    import torch
    from torchvision.transforms import v2

    from conveyor_bench.imaging import PHOTO_SIZE

    count, size = (16, (160, 120)) if quick else (DECODE_IMAGES, PHOTO_SIZE)
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(CROP, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=list(MEAN), std=list(STD)),
        ]
    )
    kwargs = {"loader": decode_with_torchvision} if torchvision_io else {}
    folder = torchvision.datasets.ImageFolder(_folder(count, size), transform, **kwargs)
    return Repeated(folder, -(-length // len(folder)))
