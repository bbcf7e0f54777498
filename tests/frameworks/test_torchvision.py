"""torchvision's ImageFolder with v2 random transforms, as most vision training runs it.

Process workers give torch's loader's batches, batch for batch, under fork and spawn
(seeded); thread workers, whose threads share torch's global generator that the random
transforms draw from, are warned about when the loader is built, naming each transform
at its attribute path (tests/unit/test_torch_draws.py has the rules; here the real
torchvision). CI runs this with torch 2.14.1 and torchvision 0.29.1 (.ci/run).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader, PreflightWarning, check
from tests.helpers.leaks import no_leaks

torch = pytest.importorskip("torch", reason="compares with torch's DataLoader: needs torch")
torchvision = pytest.importorskip(
    "torchvision",
    reason="needs torchvision: pip install torch==2.14.1 torchvision==0.29.1 (CI's lane)",
)
pytest.importorskip("PIL", reason="writes JPEGs with Pillow: pip install pillow")
from PIL import Image  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CLASSES, PER_CLASS = ("cat", "dog"), 12  # 24 images: 6 batches of 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of small photo-like JPEGs (gradients and noise), sizes varying."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (root / name).mkdir()
        for i in range(PER_CLASS):
            height, width = 40 + 4 * (i % 3), 48 + 4 * (i % 4)
            ramp = np.linspace(0, 200, width)[None, :, None] + 20 * label
            noise = rng.integers(0, 50, (height, width, 3))
            pixels = np.clip(ramp + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i:03d}.jpg", quality=90)
    return root


def _dataset(folder: Path) -> Any:
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(24, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    return torchvision.datasets.ImageFolder(str(folder), transform=transform)


def _batches(loader_class: Any, dataset: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
    generator = torch.Generator().manual_seed(1234)
    loader = loader_class(
        dataset, batch_size=4, shuffle=True, num_workers=2, generator=generator, **kwargs
    )
    with no_leaks():
        return [(images.clone(), labels.clone()) for images, labels in loader]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_workers_give_torchs_batches(folder: Path, method: str) -> None:
    dataset = _dataset(folder)
    theirs = _batches(torch.utils.data.DataLoader, dataset, multiprocessing_context=method)
    ours = _batches(DataLoader, dataset, multiprocessing_context=method)
    assert len(ours) == len(theirs) == len(CLASSES) * PER_CLASS // 4
    for (images, labels), (their_images, their_labels) in zip(ours, theirs, strict=True):
        assert images.shape == (4, 3, 24, 24)
        assert torch.equal(labels, their_labels)
        assert torch.equal(images, their_images)


def test_thread_workers_are_warned_at_construction(folder: Path) -> None:
    dataset = _dataset(folder)
    for kind in ({"worker_method": "thread"}, {"threads_per_worker": 2}):
        with pytest.warns(PreflightWarning) as caught:
            loader = DataLoader(dataset, batch_size=4, num_workers=2, **kind)
        finding = caught[0].message.finding  # type: ignore[union-attr]
        assert finding.code == "thread-torch-rng"
        assert finding.where == "dataset.transform.transforms[0]"
        assert finding.what.startswith(
            "dataset.transform.transforms[0] is a torchvision.transforms.v2.RandomResizedCrop "
            "and dataset.transform.transforms[1] is a "
            "torchvision.transforms.v2.RandomHorizontalFlip, which draw from torch's global "
            "random generator"
        )
    # The threads load the same images, but their crops follow the threads' timing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreflightWarning)
        loader = DataLoader(dataset, batch_size=4, num_workers=2, worker_method="thread")
        shapes = {tuple(images.shape) for images, _ in loader}
    assert shapes == {(4, 3, 24, 24)}


def test_check_names_v1_transforms_too(folder: Path) -> None:
    from torchvision import transforms as v1

    dataset = torchvision.datasets.ImageFolder(
        str(folder),
        transform=v1.Compose(
            [v1.RandomChoice([v1.CenterCrop(24), v1.RandomCrop(24)]), v1.ToTensor()]
        ),
    )
    report = check(dataset, num_workers=2, worker_method="thread")
    assert report.codes() == ["thread-torch-rng"]
    # RandomChoice draws from random, which each thread worker has its own of.
    assert report.findings[0].what.startswith(
        "dataset.transform.transforms[0].transforms[1] is a torchvision.transforms.RandomCrop, "
        "which draws from torch's global random generator"
    )
    assert check(dataset, num_workers=2).codes() == []  # processes: nothing to say
