"""``reseed``: what ``__getitem__`` draws from random, NumPy and torch (when installed)
depends on the sample's position, not on which worker fetched it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from conveyor import ConfigError, DataLoader

from .datasets import Draws, draw_torch, plain, seeded, torch

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _samples(reseed: str, num_workers: int, batch_size: int = 4, **kwargs: Any) -> dict[int, Any]:
    """Each sample's draws, by dataset index, from one shuffled epoch."""
    generator = seeded(11)
    if num_workers:
        kwargs.setdefault("multiprocessing_context", "fork")
    loader = DataLoader(
        Draws(24),
        batch_size=batch_size,
        shuffle=True,
        generator=generator,
        num_workers=num_workers,
        reseed=reseed,
        **kwargs,
    )
    found: dict[int, Any] = {}
    for batch in loader:
        indices, *draws = plain(batch)
        if batch_size is None:  # one sample, not a batch
            indices, draws = [indices], [[d] for d in draws]
        for position, index in enumerate(indices):
            found[index] = tuple(d[position] for d in draws)
    assert sorted(found) == list(range(24))
    return found


@pytest.mark.parametrize(
    ("reseed", "in_order"),
    [
        ("batch", True),
        ("sample", False),
        pytest.param("batch", False, marks=pytest.mark.slow),
        pytest.param("sample", True, marks=pytest.mark.slow),
    ],
)
def test_draws_do_not_depend_on_the_worker_count(reseed: str, in_order: bool) -> None:
    inline = _samples(reseed, 0)
    for workers in (1, 2, 3):
        assert _samples(reseed, workers, in_order=in_order) == inline, f"{workers} workers"


@pytest.mark.parametrize("reseed", ["batch", "sample"])
@pytest.mark.parametrize("method", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)])
def test_draws_do_not_depend_on_the_start_method(reseed: str, method: str) -> None:
    assert _samples(reseed, 2, multiprocessing_context=method) == _samples(reseed, 0)


def test_sample_draws_do_not_depend_on_the_batch_size() -> None:
    by_three = _samples("sample", 2, batch_size=3)
    assert _samples("sample", 0, batch_size=5) == by_three
    assert _samples("sample", 2, batch_size=None) == by_three
    assert _samples("batch", 0, batch_size=5) != _samples("batch", 0, batch_size=3)


def test_the_default_seeds_each_worker_once_as_torch_does() -> None:
    """What reseed is for: torch's seeding gives other draws with other worker counts."""
    assert _samples("worker", 2) != _samples("worker", 0)
    assert _samples("worker", 2) == _samples("worker", 2)  # still reproducible as such


def test_reseeding_without_workers_leaves_the_training_loop_rngs_alone() -> None:
    def seed_all() -> None:
        random.seed(5)
        np.random.seed(5)
        if torch is not None:
            torch.manual_seed(5)

    def draws_after(reseed: str) -> tuple[float, float, float]:
        seed_all()
        for _ in DataLoader(Draws(8), batch_size=4, generator=seeded(1), reseed=reseed):
            pass
        return random.random(), float(np.random.rand()), draw_torch()

    seed_all()
    untouched = (random.random(), float(np.random.rand()), draw_torch())
    assert draws_after("batch") == untouched
    assert draws_after("sample") == untouched
    assert draws_after("worker") != untouched  # torch's way: the dataset draws from them


def test_a_seeded_generator_makes_runs_reproducible() -> None:
    assert _samples("sample", 2) == _samples("sample", 3)
    other = DataLoader(Draws(24), batch_size=4, generator=seeded(12), reseed="sample")
    first = plain(next(iter(other)))
    assert tuple(d[0] for d in first[1:]) != _samples("sample", 0)[first[0][0]]


def test_reseed_must_be_a_known_mode() -> None:
    with pytest.raises(ConfigError, match="reseed must be one of"):
        DataLoader(Draws(4), reseed="epoch")
