"""The multi-process loop over a fake pool: the loop's own logic, without processes.

The real-process fault matrix (tests/faults) covers the pool; here the same
loop that runs in production is driven by tests/helpers/fake_pool.py.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from tests.helpers.fake_pool import FakePool, WouldHang

from conveyor import DataLoader, WorkerCrashedError, WorkerRestartedWarning
from conveyor._iter.multiprocess import MultiprocessIterator


class Numbers:
    """dataset[i] == i, except the indices in ``bad``, which raise ValueError."""

    def __init__(self, n: int = 16, bad: tuple[int, ...] = ()) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return i


def run(loader: DataLoader, setup: Any = None) -> tuple[MultiprocessIterator, FakePool]:
    """An iterator for ``loader`` on a fake pool; ``setup(pool)`` runs before the first task."""
    FakePool.instances.clear()
    it = MultiprocessIterator(loader._config, loader._history, pool_factory=_prepared(setup))
    return it, FakePool.instances[-1]


def _prepared(setup: Any) -> Any:
    def factory(*args: Any) -> FakePool:
        pool = FakePool(*args)
        if setup is not None:
            setup(pool)
        return pool

    return factory


def flat(batches: list[Any]) -> list[int]:
    return [int(x) for b in batches for x in b]


def loader(dataset: Any = None, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 2)
    kwargs.setdefault("num_workers", 2)
    return DataLoader(dataset if dataset is not None else Numbers(), preflight=False, **kwargs)


def test_in_order_delivery_even_when_a_worker_is_slow() -> None:
    it, pool = run(loader(), lambda p: p.slow.add(0))
    assert flat(list(it)) == list(range(16))
    assert pool.closed  # not persistent: the pool is closed at the end


def test_out_of_order_delivers_what_is_ready_and_each_batch_once() -> None:
    it, _ = run(loader(in_order=False), lambda p: p.slow.add(0))
    seen = flat(list(it))
    assert sorted(seen) == list(range(16))
    assert seen[:2] == [2, 3]  # worker 1's first batch came before worker 0's


def test_dispatch_is_round_robin_with_prefetch_then_one_per_batch() -> None:
    it, pool = run(loader(prefetch_factor=2))
    assert [(w, t.seq) for w, t in pool.sent] == [(0, 0), (1, 1), (0, 2), (1, 3)]
    next(it)
    assert [(w, t.seq) for w, t in pool.sent[4:]] == [(0, 4)]


def test_a_frozen_worker_is_waited_for_not_skipped() -> None:
    it, _ = run(loader(), lambda p: p.held.add(1))
    assert flat([next(it)]) == [0, 1]
    with pytest.raises(WouldHang):  # without timeout, the loop waits for batch 1, as torch does
        next(it)


def test_dead_worker_is_replaced_and_its_tasks_resent_exactly_once() -> None:
    it, pool = run(loader(), lambda p: p.kill_once.update({5: -9}))
    with pytest.warns(WorkerRestartedWarning, match=r"worker 0 .*SIGKILL.*re-sent its 2"):
        got = flat(list(it))
    assert got == list(range(16))
    assert pool.replaced == [0]
    assert it.statistics().worker_restarts == 1


def test_a_sample_that_kills_alone_too_is_named_and_raised() -> None:
    # kill_at is permanent: the retry (traced) and the sample alone die too.
    it, pool = run(loader(), lambda p: p.kill_at.update({5: -11}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        assert flat([next(it), next(it)]) == [0, 1, 2, 3]
        with pytest.raises(
            WorkerCrashedError,
            match=r"Dataset index 5 killed its worker 3 times, the last time alone in a fresh",
        ):
            next(it)
    assert [(t.seq, t.index) for _, t in pool.sent if t.index == [5]] == [(2, [5])]


def test_a_sample_killed_twice_by_chance_survives_alone_and_is_not_accused() -> None:
    it, pool = run(loader(), lambda p: p.kill_next.update({5: [-9, -9]}))
    with pytest.warns(WorkerRestartedWarning) as record:
        got = flat(list(it))
    assert got == list(range(16))  # every index once, 5 included
    assert "after trying dataset index 5 alone" in str(record[-1].message)
    assert pool.discarded == 1  # the probe's batch: only a verdict
    assert it.statistics().samples_skipped == 0


def test_a_poison_sample_is_skipped_recorded_and_left_out_next_epoch_without_a_crash() -> None:
    data = loader(on_error="skip", max_errors=5, persistent_workers=True)
    it, pool = run(data, lambda p: p.kill_at.update({5: -11}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        assert flat(list(it)) == [i for i in range(16) if i != 5]
    assert [(s.index, s.stage, s.epoch) for s in data.skipped_samples] == [(5, "crash", 0)]
    restarts = len(pool.replaced)
    it.reset()
    assert flat(list(it)) == [i for i in range(16) if i != 5]
    assert len(pool.replaced) == restarts  # left out up front: no further crash
    assert [(s.index, s.epoch) for s in data.skipped_samples] == [(5, 0), (5, 1)]


def test_skip_budget_error_waits_for_earlier_batches() -> None:
    # Batch 1 (indices 2, 3) spends the budget; batch 0 is slow and arrives after it.
    data = loader(Numbers(bad=(2,)), on_error="skip", max_errors=0)
    it, _ = run(data, lambda p: p.slow.add(0))
    assert flat([next(it)]) == [0, 1]  # delivered before the error, in its place
    with pytest.raises(ValueError, match="sample 2 is corrupt") as info:
        next(it)
    assert any("max_errors=0" in note for note in info.value.__notes__)


def test_user_error_keeps_its_type_and_the_loop_goes_on() -> None:
    it, _ = run(loader(Numbers(bad=(3,))))
    assert flat([next(it)]) == [0, 1]
    with pytest.raises(ValueError, match="sample 3 is corrupt") as info:
        next(it)
    context = info.value.conveyor_context  # type: ignore[attr-defined]
    assert (context.worker_id, context.stage, context.indices) == (1, "fetch", (2, 3))
    assert flat(list(it)) == list(range(4, 16))


def test_batch_that_fails_to_decode_names_worker_indices_and_stage_and_loop_goes_on() -> None:
    it, _ = run(loader(), lambda p: p.undecodable.add(1))
    assert flat([next(it)]) == [0, 1]
    with pytest.raises(LookupError, match="cannot be rebuilt here") as info:
        next(it)
    context = info.value.conveyor_context  # type: ignore[attr-defined]
    assert (context.worker_id, context.stage, context.indices, context.seq) == (
        1,
        "decode",
        (2, 3),
        1,
    )
    assert flat(list(it)) == list(range(4, 16))


def test_stale_replies_of_an_abandoned_epoch_are_discarded() -> None:
    data = loader(persistent_workers=True)
    it, pool = run(data)
    next(it)  # then abandon the epoch with tasks in flight
    it.reset()
    assert flat(list(it)) == list(range(16))
    assert pool.discarded >= 1


def test_statistics_count_batches_samples_and_workers() -> None:
    it, _ = run(loader(batch_size=4))
    list(it)
    stats = it.statistics()
    assert (stats.batches, stats.samples, stats.in_flight) == (4, 16, ())
    assert [(w.worker_id, w.batches, w.samples) for w in stats.workers] == [(0, 2, 8), (1, 2, 8)]


def test_numpy_batches_cross_the_fake_transport() -> None:
    class Arrays(Numbers):
        def __getitem__(self, i: int) -> Any:
            return np.full(3, i)

    it, _ = run(loader(Arrays(4)))
    assert [b.tolist() for b in it] == [[[0] * 3, [1] * 3], [[2] * 3, [3] * 3]]


def test_stop_iteration_in_a_workers_getitem_is_an_error_naming_the_indices() -> None:
    class StopsAtSeven(Numbers):
        def __getitem__(self, i: int) -> int:
            if i == 7:
                raise StopIteration
            return i

    it, _ = run(loader(StopsAtSeven()))
    assert flat([next(it), next(it), next(it)]) == list(range(6))
    with pytest.raises(RuntimeError, match=r"raised StopIteration .* indices \[6, 7\]"):
        next(it)
    assert flat(list(it)) == list(range(8, 16))
