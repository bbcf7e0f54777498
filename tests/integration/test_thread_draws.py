"""Random draws in thread workers: reproducible, and torch's, wherever that can be.

``random``'s and NumPy's module functions draw, in a thread worker, from that worker's
own stand-ins, seeded as a process worker's module generators (conveyor._workers.thread_draws):
the same batches as torch's process workers, run after run, and the training loop's own
stream is left alone. torch's global generator cannot be split per thread; a transform
that draws from ``torch.utils.data.get_worker_info().rng.torch_generator`` — what torch's
thread-worker plan has torchvision do — gets the thread's own generator with no change by
the user. The warnings for what draws from torch's global generator are in
tests/unit/test_torch_draws.py, with torchvision itself in tests/frameworks.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader
from tests.helpers.leaks import no_leaks

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.timeout(120), pytest.mark.torch]

# How each kind of worker runs 2 workers: the threads of this process, one process of 2
# threads, 2 processes.
KINDS = {
    "threads": {"worker_method": "thread", "num_workers": 2},
    "process of threads": {"num_workers": 1, "threads_per_worker": 2},
    "processes": {"num_workers": 2},
}


class ModuleDraws:
    """Draws from random's and NumPy's module functions, as augmentation code does."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> Any:
        return np.array(
            [
                float(index),
                random.random(),
                float(random.randint(0, 999)),
                float(np.random.rand()),
                float(np.random.randint(0, 999)),
                float(np.random.normal()),
            ]
        )


class DrawsLikeTorchsPlan:
    """A stand-in for a torchvision transform that draws as torch's thread-worker plan has
    it: from the worker's own torch generator, found through torch's get_worker_info()."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> Any:
        info = torch.utils.data.get_worker_info()
        generator = info.rng.torch_generator if info is not None and info.rng else None
        return torch.rand(3, generator=generator) + index


def _batches(loader: Any) -> list[Any]:
    with no_leaks():
        return [batch.clone() for batch in loader]


def _conveyor(dataset: Any, kind: str, **kwargs: Any) -> list[Any]:
    settings = dict(KINDS[kind], **kwargs)
    if settings.get("worker_method") != "thread":
        settings["multiprocessing_context"] = "fork"
    generator = torch.Generator().manual_seed(7)
    return _batches(DataLoader(dataset, batch_size=2, generator=generator, **settings))


def _torch(dataset: Any) -> list[Any]:
    generator = torch.Generator().manual_seed(7)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, num_workers=2, generator=generator, multiprocessing_context="fork"
    )
    return _batches(loader)


def _equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", ["threads", "process of threads"])
def test_module_draws_in_thread_workers_are_torchs_run_after_run(kind: str) -> None:
    reference = _torch(ModuleDraws())
    first = _conveyor(ModuleDraws(), kind)
    assert _equal(first, reference)
    assert _equal(_conveyor(ModuleDraws(), kind), first)


@pytest.mark.parametrize("kind", ["threads", "process of threads"])
def test_reseeded_module_draws_do_not_depend_on_the_kind_of_worker(kind: str) -> None:
    processes = _conveyor(ModuleDraws(), "processes", reseed="batch")
    assert _equal(_conveyor(ModuleDraws(), kind, reseed="batch"), processes)


def test_thread_workers_leave_the_training_loops_own_stream_alone() -> None:
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    _conveyor(ModuleDraws(), "threads")  # 16 draws of each kind, in the threads
    assert (random.random(), np.random.rand()) == expected


def test_module_functions_pickle_as_the_module_holds_them() -> None:
    _conveyor(ModuleDraws(), "threads")  # routes them, once per process
    assert pickle.loads(pickle.dumps(random.random)) is random.random
    assert pickle.loads(pickle.dumps(np.random.rand)) is np.random.rand
    random.seed(3)
    assert random.random() == random.Random(3).random()


@pytest.mark.parametrize("kind", ["threads", "process of threads"])
def test_a_transform_drawing_from_the_workers_torch_generator_needs_no_change(kind: str) -> None:
    processes = _conveyor(DrawsLikeTorchsPlan(), "processes")
    first = _conveyor(DrawsLikeTorchsPlan(), kind)
    assert _equal(first, processes)
    assert _equal(_conveyor(DrawsLikeTorchsPlan(), kind), first)
    # The draws came from each worker's own generator, not torch's global one.
    torch.manual_seed(11)
    expected = torch.rand(1)
    torch.manual_seed(11)
    _conveyor(DrawsLikeTorchsPlan(), "threads")
    assert torch.equal(torch.rand(1), expected)
