"""A state taken with process workers resumes with thread workers and back (and with
processes of several cores in threads, ``threads_per_worker``), exactly, and
``reseed`` gives the same augmentations to code that draws from the worker's own
generators (``get_worker_info().rng``) whichever kind of worker runs it."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader, get_worker_info

from .datasets import seeded, torch
from .roundtrip import assert_same, epochs_of, resumed_run

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N, BATCH = 40, 4  # 10 batches an epoch


class OwnDraws:
    """Sample ``i``: ``(i, draws from the worker's own Python, NumPy and torch
    generators)``, as an augmentation written for thread workers draws."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        info = get_worker_info()
        assert info is not None, "this dataset runs in workers only"
        rng = info.rng
        draws = [rng.random_generator.random(), float(rng.numpy_generator.random())]
        if torch is not None:
            draws.append(float(torch.rand((), generator=rng.torch_generator)))
        return (i, *draws)


def _plain(batch: Any) -> Any:
    return [np.asarray(column).tolist() for column in batch]


def _loader(num_workers: int, worker_method: str, seed: int = 3, **kwargs: Any) -> DataLoader:
    options: dict[str, Any] = dict(batch_size=BATCH, reseed="batch", shuffle=True)
    options["generator"] = seeded(seed)  # torch's, or NumPy's without torch
    if worker_method == CORES:  # num_workers processes of 2 cores each
        options["threads_per_worker"] = 2
        worker_method = PROCESSES
    options["worker_method"] = worker_method
    if worker_method == PROCESSES:
        options["multiprocessing_context"] = "fork"
    options.update(kwargs)
    return DataLoader(OwnDraws(), num_workers=num_workers, **options)


PROCESSES, THREADS, CORES = "multiprocessing", "thread", "cores in threads"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((4, PROCESSES), (8, THREADS)),
        ((8, THREADS), (4, PROCESSES)),
        ((3, THREADS), (2, THREADS)),
        ((2, CORES), (5, THREADS)),
        ((6, THREADS), (3, CORES)),
        ((3, PROCESSES), (2, CORES)),
    ],
    ids=[
        "processes-to-threads",
        "threads-to-processes",
        "threads-to-threads",
        "cores-to-threads",
        "threads-to-cores",
        "processes-to-cores",
    ],
)
@pytest.mark.parametrize("step", [5, 11], ids=["middle", "boundary"])
def test_a_state_moves_between_worker_methods(
    before: tuple[int, str], after: tuple[int, str], step: int
) -> None:
    make = functools.partial(_loader, *before)
    expected = epochs_of(make, 2)
    got = resumed_run(make, functools.partial(_loader, *after, seed=99), step, 2)
    assert_same([[_plain(b) for b in e] for e in expected], [[_plain(b) for b in e] for e in got])


def _draws(num_workers: int, worker_method: str, reseed: str) -> dict[int, Any]:
    loader = _loader(num_workers, worker_method, reseed=reseed)
    found = {}
    for batch in loader:
        indices, *draws = _plain(batch)
        for position, index in enumerate(indices):
            found[index] = tuple(d[position] for d in draws)
    assert sorted(found) == list(range(N))
    return found


@pytest.mark.parametrize("reseed", ["batch", "sample"])
def test_reseed_draws_from_the_workers_generators_do_not_depend_on_the_method(
    reseed: str,
) -> None:
    assert _draws(2, PROCESSES, reseed) == _draws(5, THREADS, reseed)
    assert _draws(2, CORES, reseed) == _draws(5, THREADS, reseed)


def test_without_reseed_each_worker_is_seeded_as_torch_seeds_it() -> None:
    """Its own generators too: the same worker id gives the same draws, process or thread."""
    processes, threads = _draws(2, PROCESSES, "worker"), _draws(2, THREADS, "worker")
    assert processes == threads  # same workers, same tasks (round-robin), same seeds
