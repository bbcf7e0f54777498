"""What draws from torch's global generator is named when a loader with thread workers is
built (and by ``conveyor.check`` and the doctor), at its attribute path, with the fix.

torchvision is not needed here: a stand-in ``torchvision.transforms.v2`` module holds
classes of torchvision's names, drawing as torchvision 0.29 does (from torch's global
generator) or as torch's thread-worker plan would have it (from the worker's own); the
real torchvision is in tests/frameworks/test_torchvision.py.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor import DataLoader, PreflightWarning, check
from conveyor.diagnostics import torch_draws

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def _stand_in_v2(per_thread: bool) -> types.ModuleType:
    """``torchvision.transforms.v2`` with a flip, a crop and a deterministic transform."""

    def generator() -> Any:
        if not per_thread:
            return None  # torch's global generator, as torchvision 0.29 draws
        info = torch.utils.data.get_worker_info()
        return info.rng.torch_generator if info is not None and info.rng else None

    class RandomHorizontalFlip:
        def __init__(self, p: float = 0.5) -> None:
            self.p = p

        def __call__(self, image: Any) -> Any:
            return image.flip(-1) if torch.rand(1, generator=generator()) < self.p else image

    class RandomResizedCrop(RandomHorizontalFlip):
        pass

    class ToDtype:
        def __call__(self, image: Any) -> Any:
            return image.float()

    class Compose:
        def __init__(self, transforms: list[Any]) -> None:
            self.transforms = transforms

        def __call__(self, image: Any) -> Any:
            for transform in self.transforms:
                image = transform(image)
            return image

    module = types.ModuleType("torchvision.transforms.v2")
    for cls in (RandomHorizontalFlip, RandomResizedCrop, ToDtype, Compose):
        setattr(module, cls.__name__, cls)
    return module


@pytest.fixture(params=[False, True], ids=["global draws", "per-thread draws"])
def v2(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    module = _stand_in_v2(per_thread=request.param)
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.transforms.v2", module)
    monkeypatch.setattr(torch_draws, "_still_global", {})  # the probe runs afresh
    module.per_thread = request.param
    yield module


class Images:
    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        return self.transform(torch.full((1, 2, 2), index, dtype=torch.uint8))


def _dataset(v2: Any) -> Images:
    return Images(v2.Compose([v2.RandomResizedCrop(), v2.RandomHorizontalFlip(), v2.ToDtype()]))


def _built(dataset: Any, **kwargs: Any) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DataLoader(dataset, batch_size=2, num_workers=2, **kwargs)
    return [w for w in caught if issubclass(w.category, PreflightWarning)]


def test_thread_workers_are_warned_at_construction_where_draws_are_global(v2: Any) -> None:
    found = _built(_dataset(v2), worker_method="thread")
    if v2.per_thread:  # torchvision drawing from the worker's generator: nothing to say
        assert found == []
        return
    assert len(found) == 1
    assert found[0].filename == __file__  # the user's DataLoader(...) line
    finding = found[0].message.finding  # type: ignore[union-attr]
    assert (finding.code, finding.where) == ("thread-torch-rng", "dataset.transform.transforms[0]")
    assert finding.what == (
        "dataset.transform.transforms[0] is a torchvision.transforms.v2.RandomResizedCrop and "
        "dataset.transform.transforms[1] is a torchvision.transforms.v2.RandomHorizontalFlip, "
        "which draw from torch's global random generator: one per process, shared by the "
        "thread workers"
    )
    assert "torch's generator cannot be split" in finding.why
    assert finding.fix.startswith("use worker processes of one thread each")
    assert "info.rng.torch_generator" in finding.fix


def test_processes_of_several_threads_are_warned_too(v2: Any) -> None:
    found = _built(_dataset(v2), threads_per_worker=2, multiprocessing_context="fork")
    assert [w.message.finding.code for w in found] == (  # type: ignore[union-attr]
        [] if v2.per_thread else ["thread-torch-rng"]
    )


def test_process_workers_and_no_preflight_say_nothing(v2: Any) -> None:
    assert _built(_dataset(v2)) == []  # each process has torch's generator, seeded as torch's
    assert _built(_dataset(v2), worker_method="thread", preflight=False) == []


def test_check_names_it_and_the_first_iteration_does_not_repeat_it(v2: Any) -> None:
    report = check(_dataset(v2), num_workers=2, worker_method="thread")
    assert report.codes() == ([] if v2.per_thread else ["thread-torch-rng"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(_dataset(v2), batch_size=2, num_workers=2, worker_method="thread")
        said = len(caught)
        batches = list(loader)
    assert said == (0 if v2.per_thread else 1)
    assert len(caught) == said  # nothing more at the first iteration
    assert len(batches) == 4


def test_a_subclass_is_named_as_one(v2: Any) -> None:
    class MyCrop(v2.RandomResizedCrop):  # type: ignore[misc, name-defined]
        pass

    report = check(Images(MyCrop()), num_workers=2, worker_method="thread")
    if v2.per_thread:
        assert report.ok
        return
    assert report.findings[0].what.startswith(
        "dataset.transform is a subclass of torchvision.transforms.v2.RandomResizedCrop, "
        "which draws from torch's global random generator"
    )


def test_the_probe_leaves_torchs_global_generator_as_it_was(v2: Any) -> None:
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    named = torch_draws.torch_draw_of(v2.RandomResizedCrop)  # the probe runs first here
    assert named == (None if v2.per_thread else "torchvision.transforms.v2.RandomResizedCrop")
    assert torch.equal(torch.rand(2), expected)
