"""num_workers=0: the same task runner and statistics as with workers, in this process."""

from __future__ import annotations

import pytest

from conveyor import DataLoader


class Numbers:
    def __init__(self, bad: tuple[int, ...] = ()) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index in self.bad:
            raise ValueError(f"sample {index} is corrupt")
        return index


def test_statistics_without_workers() -> None:
    loader = DataLoader(Numbers(bad=(4,)), batch_size=3, on_error="skip", max_errors=1)
    assert loader.statistics() is None  # before the first iteration
    it = iter(loader)
    next(it)
    running = loader.statistics()
    assert running is not None and (running.epoch, running.batches, running.samples) == (0, 1, 3)
    rest = list(it)
    assert [b.tolist() for b in rest] == [[3, 5], [6, 7, 8], [9]]
    final = loader.statistics()
    assert final is not None
    assert (final.batches, final.samples, final.samples_skipped) == (4, 9, 1)
    assert (final.worker_restarts, final.in_flight, final.workers) == (0, (), ())
    list(loader)
    second = loader.statistics()
    assert second is not None and (second.epoch, second.batches) == (1, 4)


def test_skip_budget_without_workers_raises_the_samples_own_error() -> None:
    loader = DataLoader(Numbers(bad=(1, 2)), batch_size=2, on_error="skip", max_errors=1)
    with pytest.raises(ValueError, match="sample 2 is corrupt") as info:
        list(loader)
    assert "max_errors=1" in info.value.__notes__[-1]
    assert [s.index for s in loader.skipped_samples] == [1, 2]


class StopsAt:
    def __init__(self, stop: int) -> None:
        self.stop = stop

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index == self.stop:
            raise StopIteration  # e.g. next() on an exhausted reader, leaking out
        return index


def test_stop_iteration_in_getitem_is_an_error_not_a_short_epoch() -> None:
    loader = DataLoader(StopsAt(5), batch_size=2)
    it = iter(loader)
    assert [b.tolist() for b in (next(it), next(it))] == [[0, 1], [2, 3]]
    with pytest.raises(RuntimeError, match=r"raised StopIteration .* indices \[4, 5\]") as info:
        next(it)
    assert isinstance(info.value.__cause__, StopIteration)
    assert [b.tolist() for b in it] == [[6, 7], [8, 9]]  # like any error: the loop goes on
