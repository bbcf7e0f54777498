"""The bookkeeping behind state_dict(), without processes: what was handed out, and
which per-worker states belong to a snapshot."""

from __future__ import annotations

from typing import Any

from conveyor import DataLoader
from conveyor._iter.cursor import END, SamplerCursor
from conveyor._iter.parse_state import parse
from conveyor._iter.progress import Progress
from conveyor._task.dataset_state import WorkerState
from conveyor.config import LoaderHistory


def _progress(num_workers: int = 2, per_worker: bool = False, every: int = 1) -> Progress:
    loader = DataLoader(list(range(20)), batch_size=2, snapshot_every_n_steps=every)
    config = loader._config
    cursor = SamplerCursor(config)
    cursor.start()
    for _ in range(6):
        assert cursor.next() is not END
    return Progress(
        config=config,
        history=LoaderHistory(),
        cursor=cursor,
        num_workers=num_workers,
        base_seed=7,
        epoch=0,
        per_worker=per_worker,
    )


def _point(progress: Progress) -> Any:
    return parse(progress.state_dict(), dataset_len=20, iterable=False)


def test_the_prefix_moves_only_over_positions_handed_out() -> None:
    progress = _progress()
    progress.start_from(None)
    for seq in (0, 2, 3):
        progress.handed_out(seq, seq % 2, None)
    point = _point(progress)
    assert (point.delivered, sorted(point.beyond)) == (1, [2, 3])
    progress.handed_out(1, 1, None)  # the gap closes: the prefix runs through 2 and 3
    point = _point(progress)
    assert (point.delivered, sorted(point.beyond), point.yielded) == (4, [], 4)


def test_an_empty_batch_moves_the_position_but_is_not_a_batch_handed_out() -> None:
    progress = _progress()
    progress.start_from(None)
    progress.handed_out(0, 0, None, empty=True)
    progress.handed_out(1, 1, None)
    point = _point(progress)
    assert (point.delivered, point.yielded) == (2, 1)


def test_worker_states_are_those_of_the_last_snapshot_step() -> None:
    progress = _progress(per_worker=True, every=2)
    progress.start_from(None)
    progress.worker_reported(0, WorkerState({"i": 0}))
    progress.worker_reported(1, WorkerState({"i": 0}))
    progress.handed_out(0, 0, WorkerState({"i": 1}))
    progress.handed_out(1, 1, WorkerState({"i": 1}))  # step 2: a snapshot
    progress.handed_out(2, 0, WorkerState({"i": 2}))  # not a snapshot step
    state = progress.state_dict()
    snapshots = state["_snapshot"]["_worker_snapshots"]
    assert [snapshots[f"worker_{i}"]["dataset_state"] for i in (0, 1)] == [{"i": 1}, {"i": 1}]
    assert (state["_snapshot"]["_snapshot_step"], state["_steps_since_snapshot"]) == (2, 1)
    point = parse(state, dataset_len=20, iterable=False)
    assert (point.delivered, point.replay) == (2, 1)  # the step since is fetched again


def test_a_late_start_up_report_belongs_to_the_snapshots_before_that_worker_delivers() -> None:
    progress = _progress(per_worker=True, every=5)
    progress.start_from(None)
    progress.handed_out(0, 0, WorkerState({"w0": 1}))
    progress.worker_reported(1, WorkerState({"w1": 0}))  # worker 1 reported after batch 0
    progress.worker_reported(0, WorkerState({"w0": 0}))  # too late: worker 0 delivered since
    snapshots = progress.state_dict()["_snapshot"]["_worker_snapshots"]
    assert snapshots["worker_1"]["dataset_state"] == {"w1": 0}
    assert snapshots["worker_0"]["dataset_state"] is None  # the step-0 snapshot: not yet known


def test_the_epoch_end_takes_a_last_snapshot_and_the_generators() -> None:
    progress = _progress(per_worker=True, every=10)
    progress.start_from(None)
    progress.handed_out(0, 0, WorkerState({"i": 9}))
    progress.ended()
    state = progress.state_dict()
    assert state["_iterator_finished"] is True
    assert state["_steps_since_snapshot"] == 0
    assert state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"] == {"i": 9}
    assert state["conveyor"]["rng_after"] == []  # a sequential sampler: no generator
