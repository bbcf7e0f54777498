"""Supervision options: on_error="skip", max_errors, max_worker_restarts, stalls, timeouts.

Skipped samples must be recorded (``loader.skipped_samples``), counted against the
epoch's budget, and logged; a sample proven to kill its worker (it kills a fresh
worker alone too) is skipped and stays skipped in later epochs; ``loader.statistics()``
tells restarts and retries; a stuck task is reported with the worker's Python stack.
Whether a fault is handled does not depend on the start method (test_fault_matrix.py
runs those), so these run under fork only. The autouse ``leak_check`` fixture
(conftest.py) checks for leftovers after each.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import (
    ConfigError,
    DataLoader,
    LoaderStatistics,
    SkippedSample,
    WorkerCrashedError,
    WorkerError,
    WorkerRestartedWarning,
    WorkerStallWarning,
    WorkerStatistics,
    WorkerTimeoutError,
)
from conveyor.errors import Culprit
from tests.helpers.sync import Mailbox, post, wait_exit

pytestmark = pytest.mark.timeout(60)

RESTARTED = "ignore::conveyor.WorkerRestartedWarning"


class Flaky:
    """``dataset[i]`` is ``i``; indices in ``bad`` raise KeyError, those in ``kill``
    SIGKILL the worker (only once each when ``marker_dir`` is given: a marker file per
    index is created first), those in ``segfault`` crash it with SIGSEGV (a death of
    its own: strong evidence), those in ``slow`` sleep ``slow_s`` in ``_slow_read``."""

    def __init__(
        self,
        length: int = 10,
        *,
        bad: Iterable[int] = (),
        kill: Iterable[int] = (),
        marker_dir: str = "",
        slow: Iterable[int] = (),
        slow_s: float = 3.0,
        segfault: Iterable[int] = (),
    ) -> None:
        self.length = length
        self.bad = frozenset(bad)
        self.kill = frozenset(kill)
        self.segfault = frozenset(segfault)
        self.marker_dir = marker_dir
        self.slow = frozenset(slow)
        self.slow_s = slow_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index in self.bad:
            raise KeyError(f"missing {index}")
        if index in self.kill:
            _kill_self(self.marker_dir, index)
        if index in self.segfault:
            faulthandler.disable()  # pytest's, inherited by fork: keep the output clean
            os.kill(os.getpid(), signal.SIGSEGV)
        if index in self.slow:
            _slow_read(self.slow_s)
        return index


def _kill_self(marker_dir: str, index: int) -> None:
    if marker_dir:
        marker = Path(marker_dir, f"killed-{index}")
        if marker.exists():
            return
        marker.write_text(str(os.getpid()))  # who was killed
    os.kill(os.getpid(), signal.SIGKILL)


def _slow_read(seconds: float) -> None:
    time.sleep(seconds)  # a dead network mount, say


def collate_fails_on_5(batch: list[int]) -> list[int]:
    if 5 in batch:
        raise ValueError(f"cannot collate {batch}")
    return list(batch)


def hangs_on_3(batch: list[int]) -> list[int]:
    if 3 in batch:
        _slow_read(60)
    return list(batch)


def _loader(dataset: Any, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 2)
    kwargs.setdefault("num_workers", 1)
    kwargs.setdefault("collate_fn", list)
    return DataLoader(dataset, multiprocessing_context="fork", **kwargs)


def _records(loader: DataLoader) -> list[tuple[Any, ...]]:
    return sorted(
        (s.index, s.epoch, s.worker_id, s.stage, s.exception_type, s.message)
        for s in loader.skipped_samples
    )


# --- on_error="skip" ------------------------------------------------------------------


def test_failing_samples_are_left_out_and_recorded(caplog: pytest.LogCaptureFixture) -> None:
    # 2 workers: batches go round-robin, so batch 1 ([2, 3]) and 3 ([6, 7]) are worker 1's.
    loader = _loader(Flaky(bad={2, 3, 6}), num_workers=2, on_error="skip", max_errors=3)

    with caplog.at_level(logging.WARNING, logger="conveyor"):
        batches = list(loader)

    assert batches == [[0, 1], [4, 5], [7], [8, 9]]  # [2, 3] went whole; [6, 7] shrank
    assert _records(loader) == [
        (2, 0, 1, "fetch", "builtins.KeyError", "'missing 2'"),
        (3, 0, 1, "fetch", "builtins.KeyError", "'missing 3'"),
        (6, 0, 1, "fetch", "builtins.KeyError", "'missing 6'"),
    ]
    assert all(isinstance(s, SkippedSample) for s in loader.skipped_samples)
    stats = loader.statistics()
    assert stats is not None
    assert (stats.batches, stats.samples, stats.samples_skipped) == (4, 7, 3)
    summaries = [r for r in caplog.records if r.name == "conveyor"]
    assert len(summaries) == 1
    assert summaries[0].levelno == logging.WARNING
    message = summaries[0].getMessage()
    assert message.startswith("Epoch 0: skipped 3 sample(s) under on_error='skip': ")
    for index in (2, 3, 6):
        assert f"{index} (KeyError)" in message
    assert "loader.skipped_samples" in message


def test_no_summary_is_logged_for_an_epoch_without_skips(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loader = _loader(Flaky(), on_error="skip")

    with caplog.at_level(logging.DEBUG, logger="conveyor"):
        assert len(list(loader)) == 5

    assert [r for r in caplog.records if r.name == "conveyor"] == []
    assert loader.skipped_samples == ()


def test_failing_collate_leaves_the_whole_batch_out() -> None:
    loader = _loader(Flaky(), collate_fn=collate_fails_on_5, on_error="skip", max_errors=2)

    assert list(loader) == [[0, 1], [2, 3], [6, 7], [8, 9]]
    assert _records(loader) == [
        (4, 0, 0, "collate", "builtins.ValueError", "cannot collate [4, 5]"),
        (5, 0, 0, "collate", "builtins.ValueError", "cannot collate [4, 5]"),
    ]


@pytest.mark.parametrize(
    ("max_errors", "bad", "allowed"),
    [
        pytest.param(3, {2, 3, 6}, 3, id="count-at-budget"),
        pytest.param(2, {2, 3, 6}, 2, id="count-past-budget"),
        pytest.param(0.25, {2, 3, 6}, 3, id="fraction-rounds-up"),  # 2.5 of 10 -> 3
        pytest.param(0.25, {2, 3, 6, 7}, 3, id="fraction-past-budget"),
        pytest.param(0.01, {6}, 1, id="default-at-budget"),  # 0.1 of 10 -> 1
        pytest.param(0.01, {3, 6}, 1, id="default-past-budget"),
    ],
)
def test_error_budget_raises_the_original_type_past_it(
    max_errors: float, bad: set[int], allowed: int
) -> None:
    # ``allowed``: samples an epoch of 10 may lose (a fraction is rounded up).
    loader = _loader(Flaky(bad=bad), on_error="skip", max_errors=max_errors)
    expected = [[i for i in pair if i not in bad] for pair in ([0, 1], [2, 3], [4, 5], [6, 7])]
    expected = [b for b in expected if b] + [[8, 9]]
    received: list[list[int]] = []

    if len(bad) <= allowed:
        received = list(loader)
        assert received == expected
        assert len(loader.skipped_samples) == len(bad)
        return

    with pytest.raises(KeyError) as info:
        for batch in loader:
            received.append(batch)

    last = max(bad)  # the sample that broke the budget (batches arrive in order here)
    assert info.value.args == (f"missing {last}",)
    assert received == expected[: len(received)]
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"on_error='skip' gave up: {len(bad)} samples skipped in epoch 0" in notes
    assert f"max_errors={max_errors!r} allows ({allowed} samples)" in notes
    assert "loader.skipped_samples" in notes
    context = info.value.conveyor_context  # type: ignore[attr-defined]
    batch = (last - last % 2, last - last % 2 + 1)  # batches of two
    assert (context.stage, context.indices, context.culprit) == ("fetch", batch, Culprit((last,)))
    assert f"during fetch of dataset index {last}, in batch {last // 2} " in notes
    assert sorted(s.index for s in loader.skipped_samples) == sorted(bad)


def test_budget_is_per_epoch() -> None:
    loader = _loader(Flaky(bad={3}), on_error="skip", max_errors=1, persistent_workers=True)

    for epoch in range(3):
        assert list(loader) == [[0, 1], [2], [4, 5], [6, 7], [8, 9]]
        assert [s.epoch for s in loader.skipped_samples] == list(range(epoch + 1))


# --- samples that kill their worker -----------------------------------------------------


def test_poison_sample_is_skipped_then_left_out_next_epoch_without_a_crash() -> None:
    loader = _loader(Flaky(8, segfault={3}), on_error="skip", persistent_workers=True)

    with pytest.warns(WorkerRestartedWarning) as record:
        first = list(loader)

    assert first == [[0, 1], [2], [4, 5], [6, 7]]
    # The first death, then the traced retry's, which names the sample, then the
    # sample's alone in a fresh worker: the proof.
    assert len(record) == 3
    assert "at dataset index 3:" in str(record[1].message)
    assert "at dataset index 3 (tried alone in a fresh worker)" in str(record[2].message)
    assert "not counted against max_worker_restarts" in str(record[2].message)
    (skip,) = loader.skipped_samples
    assert (skip.index, skip.epoch, skip.worker_id, skip.stage) == (3, 0, 0, "crash")
    assert skip.exception_type == "conveyor.errors.WorkerCrashedError"
    assert skip.message.startswith("killed its worker 3 times: killed by signal SIGSEGV (-11)")
    stats = loader.statistics()
    assert stats is not None
    assert stats.worker_restarts == 3
    pid = stats.workers[0].pid

    second = list(loader)  # filterwarnings=error: a restart warning here would fail

    assert second == first
    stats = loader.statistics()
    assert stats is not None
    assert (stats.epoch, stats.worker_restarts, stats.workers[0].pid) == (1, 3, pid)


def test_poison_sample_left_out_in_a_later_epoch_is_recorded_for_that_epoch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loader = _loader(Flaky(8, segfault={3}), on_error="skip", persistent_workers=True)
    with pytest.warns(WorkerRestartedWarning):
        list(loader)

    with caplog.at_level(logging.WARNING, logger="conveyor"):
        second = list(loader)
    skips = [(s.index, s.epoch, s.stage) for s in loader.skipped_samples]
    del loader  # stop its persistent workers now, even when an assertion fails

    assert second == [[0, 1], [2], [4, 5], [6, 7]]
    assert skips == [(3, 0, "crash"), (3, 1, "crash")]
    assert any("Epoch 1: skipped 1 sample(s)" in r.getMessage() for r in caplog.records)


def test_no_restart_budget_raises_at_the_first_death() -> None:
    loader = _loader(Flaky(8, kill={3}), max_worker_restarts=0, prefetch_factor=1)
    received = []

    with pytest.raises(WorkerCrashedError) as info:  # and no restart warning
        for batch in loader:
            received.append(batch)

    assert received == [[0, 1]]
    exc = info.value
    assert isinstance(exc, WorkerError)
    assert (exc.worker_id, exc.exitcode, exc.indices) == (0, -9, (2, 3))
    assert "killed by signal SIGKILL (-9)" in str(exc)
    assert "The restart budget is spent (max_worker_restarts=0)" in str(exc)


def test_restart_budget_counts_every_death(tmp_path: Path) -> None:
    # Samples 1 and 5 each kill a worker once: the second death is past a budget of 1.
    loader = _loader(Flaky(8, kill={1, 5}, marker_dir=str(tmp_path)), max_worker_restarts=1)

    with (
        pytest.warns(WorkerRestartedWarning, match=r"restart 1 of 1") as record,
        pytest.raises(WorkerCrashedError) as info,
    ):
        list(loader)

    assert len(record) == 1
    assert "The restart budget is spent (max_worker_restarts=1)" in str(info.value)
    assert 5 in info.value.indices


class InitDiesOnStarts:
    """worker_init_fn that SIGKILLs the worker on the given start numbers (0-based),
    counted in a file (every start appends a byte)."""

    def __init__(self, path: str, deadly: frozenset[int]) -> None:
        self.path = path
        self.deadly = deadly

    def __call__(self, worker_id: int) -> None:
        starts = Path(self.path)
        count = starts.stat().st_size if starts.exists() else 0
        with starts.open("ab") as f:
            f.write(b"x")
        if count in self.deadly:
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.filterwarnings(RESTARTED)
def test_startup_deaths_far_apart_are_not_a_repeating_fault(tmp_path: Path) -> None:
    # Start 0 dies in worker_init; start 1 serves batches until sample 5 kills it once;
    # start 2 dies in worker_init again; start 3 finishes. 3 restarts: within the budget.
    loader = _loader(
        Flaky(8, kill={5}, marker_dir=str(tmp_path)),
        worker_init_fn=InitDiesOnStarts(str(tmp_path / "starts"), frozenset({0, 2})),
    )

    assert list(loader) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    stats = loader.statistics()
    assert stats is not None
    assert stats.worker_restarts == 3


class HangsInThreeOnce:
    """``dataset[3]`` posts its worker's pid to ``mailbox`` and hangs until it is killed
    (once: a marker file; the retry gets 3)."""

    def __init__(self, mailbox: str, marker: str) -> None:
        self.mailbox = mailbox
        self.marker = marker

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 3 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            post(self.mailbox, str(os.getpid()))
            time.sleep(60)  # stuck until the sampler kills it
        return index


class KillsTheWorkerBeforeTheThirdBatch:
    """Batches of 2. Asked for the third, the sampler (in the main process) waits until the
    worker is in ``dataset[3]``, SIGKILLs it and waits until it is dead."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    def __len__(self) -> int:
        return 4

    def __iter__(self) -> Iterator[list[int]]:
        for k in range(4):
            if k == 2:
                pid = int(self.mailbox.wait())
                os.kill(pid, signal.SIGKILL)
                wait_exit(pid)
            yield [2 * k, 2 * k + 1]


@pytest.mark.filterwarnings(RESTARTED)
def test_worker_dying_while_the_next_task_is_sent_is_recovered(tmp_path: Path) -> None:
    # The worker is alive when batch 0 arrives; while the sampler draws batch 2, it dies
    # on batch 1; then batch 2 is sent to it.
    with Mailbox(tmp_path / "reached") as box:
        loader = DataLoader(
            HangsInThreeOnce(box.path, str(tmp_path / "killed")),
            batch_sampler=KillsTheWorkerBeforeTheThirdBatch(box),
            num_workers=1,
            collate_fn=list,
            multiprocessing_context="fork",
        )

        assert list(loader) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    stats = loader.statistics()
    assert stats is not None
    assert stats.worker_restarts == 1  # the death was seen and handled


# --- statistics -------------------------------------------------------------------------


@pytest.mark.filterwarnings(RESTARTED)
def test_statistics_after_a_restart(tmp_path: Path) -> None:
    # 2 workers; batch 1 ([2, 3]) is worker 1's and kills it once.
    loader = _loader(Flaky(8, kill={3}, marker_dir=str(tmp_path)), num_workers=2)
    assert loader.statistics() is None  # before the first iteration
    sent = time.monotonic()  # no task is older than this
    it = iter(loader)
    started = loader.statistics()
    assert started is not None
    first_pid = started.workers[0].pid  # worker 0 never dies
    assert next(it) == [0, 1]

    during = loader.statistics()
    oldest_possible = time.monotonic() - sent
    assert isinstance(during, LoaderStatistics)
    assert (during.epoch, during.batches, during.samples) == (0, 1, 2)
    assert during.in_flight  # the prefetched batches
    for task in during.in_flight:  # any of batches 1-3, on either worker
        assert 1 <= task.seq <= 3 and task.worker_id in (0, 1), task
        assert task.indices == (2 * task.seq, 2 * task.seq + 1), task
        assert 0 <= task.age_s <= oldest_possible, (task, oldest_possible)
    assert [t.seq for t in during.in_flight] == sorted(t.seq for t in during.in_flight)

    rest = list(it)

    assert rest == [[2, 3], [4, 5], [6, 7]]
    stats = loader.statistics()
    assert isinstance(stats, LoaderStatistics)
    with pytest.raises(AttributeError):
        stats.batches = 0  # type: ignore[misc]  # frozen
    assert (stats.epoch, stats.batches, stats.samples) == (0, 4, 8)
    assert (stats.worker_restarts, stats.samples_skipped, stats.in_flight) == (1, 0, ())
    assert stats.tasks_retried >= 1  # [2, 3], and whatever else worker 1 held
    assert all(isinstance(w, WorkerStatistics) for w in stats.workers)
    assert [w.worker_id for w in stats.workers] == [0, 1]
    assert [w.restarts for w in stats.workers] == [0, 1]
    assert stats.workers[0].pid == first_pid
    # The replacement (worker 1 may have died already while iter() awaited the workers'
    # start: the marker says which process was killed).
    killed = int(Path(tmp_path, "killed-3").read_text())
    assert stats.workers[1].pid not in (None, killed)
    assert sum(w.batches for w in stats.workers) == 4
    assert sum(w.samples for w in stats.workers) == 8
    assert all(w.samples_per_s > 0 for w in stats.workers)


# --- stalls and timeouts ------------------------------------------------------------------


def test_stalled_task_is_reported_once_with_the_workers_stack() -> None:
    loader = _loader(Flaky(4, slow={1}, slow_s=3.0), stall_warning=1)

    with pytest.warns(WorkerStallWarning) as record:
        batches = list(loader)

    assert batches == [[0, 1], [2, 3]]
    # Once, not at every check. (Only batch 0 is slow by design; on a loaded machine
    # batch 1 may pass the second too, and is rightly reported then.)
    [message] = [str(w.message) for w in record if "on batch 0 (" in str(w.message)]
    assert "DataLoader worker 0 (pid " in message
    assert "on batch 0 (dataset indices [0, 1]), in stage fetch" in message
    assert "It may be stuck" in message
    assert "Its current Python stack:" in message
    assert "in _slow_read" in message
    assert "in __getitem__" in message


def test_timeout_error_names_worker_batch_stage_and_stack() -> None:
    # 2 workers: batch 1 ([2, 3]) goes to worker 1, whose collate_fn hangs.
    loader = _loader(Flaky(8), num_workers=2, collate_fn=hangs_on_3, timeout=1)
    it = iter(loader)
    assert next(it) == [0, 1]
    stats = loader.statistics()
    assert stats is not None
    pid = stats.workers[1].pid

    with pytest.raises(WorkerTimeoutError) as info:
        list(it)

    exc = info.value
    assert isinstance(exc, TimeoutError)
    assert isinstance(exc, RuntimeError)
    message = str(exc)
    assert message.startswith(
        f"DataLoader timed out after 1 seconds: worker 1 (pid {pid}) has been on batch 1 "
        "(dataset indices [2, 3]) for "
    )
    assert "in stage collate" in message
    assert "on_timeout='restart'" in message
    assert "The worker's current Python stack:" in message
    assert "in _slow_read" in message
    assert "in hangs_on_3" in message


@pytest.mark.slow  # waits out a timeout twice (about 3.5 s)
def test_sample_that_hangs_every_time_is_skipped_under_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loader = _loader(
        Flaky(6, slow={3}, slow_s=60), timeout=1, on_timeout="restart", on_error="skip"
    )

    with pytest.warns(WorkerRestartedWarning, match="past timeout=1, so conveyor killed it"):
        batches = list(loader)

    assert batches == [[0, 1], [2], [4, 5]]
    (skip,) = loader.skipped_samples
    assert (skip.index, skip.stage) == (3, "crash")
    assert "past timeout=1, so conveyor killed it" in skip.message


# --- option values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_worker_restarts", -1),
        ("max_worker_restarts", 1.5),
        ("max_worker_restarts", "3"),
        ("max_worker_restarts", None),
        ("on_error", "ignore"),
        ("on_error", None),
        ("on_timeout", "retry"),
        ("on_timeout", "skip"),
        ("max_errors", -1),
        ("max_errors", -0.5),
        ("max_errors", 1.0),
        ("max_errors", 2.5),
        ("max_errors", True),
        ("max_errors", "0.1"),
        ("max_errors", math.nan),
        ("stall_warning", 0),
        ("stall_warning", -1.0),
        ("stall_warning", math.inf),
        ("stall_warning", "5"),
        ("stall_warning", True),
        ("max_worker_restarts", True),
    ],
)
def test_invalid_option_raises_config_error_naming_it(option: str, value: Any) -> None:
    for num_workers in (0, 1):  # checked up front, whether or not workers are used
        with pytest.raises(ConfigError) as info:
            DataLoader(range(4), num_workers=num_workers, **{option: value})
        assert isinstance(info.value, ValueError)
        assert option in str(info.value)
        assert repr(value) in str(info.value)


def test_float_budget_error_suggests_a_count() -> None:
    with pytest.raises(ConfigError, match=r"pass an int: max_errors=2"):
        DataLoader(range(4), max_errors=2.0)


def test_skip_works_without_workers() -> None:
    loader = DataLoader(
        Flaky(6, bad={3}), batch_size=2, collate_fn=list, on_error="skip", max_errors=1
    )

    assert list(loader) == [[0, 1], [2], [4, 5]]
    assert [(s.index, s.stage) for s in loader.skipped_samples] == [(3, "fetch")]


class TupleRows:
    """A list- or NumPy-backed dataset; index 3 is corrupt."""

    def __init__(self, backing: str) -> None:
        rows = [[i, i * 10] for i in range(8)]
        self.rows: Any = np.array(rows) if backing == "numpy" else rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Any:
        if index == 3:
            raise ValueError("row 3 is corrupt")
        return np.asarray(self.rows[index])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("backing", ["list", "numpy"])
def test_batch_sampler_yielding_tuples_works_under_skip(workers: int, backing: str) -> None:
    # A batch sampler may yield tuples; each element is one dataset index, never
    # the tuple as a whole (numpy would fancy-index it and return wrong rows).
    batches = [(0, 1), (2, 3), (4, 5), (6, 7)]
    loader = DataLoader(
        TupleRows(backing),
        batch_sampler=batches,
        num_workers=workers,
        on_error="skip",
        max_errors=1,
        **({"multiprocessing_context": "fork"} if workers else {}),
    )
    got = [row.tolist() for batch in loader for row in batch]
    assert got == [[i, i * 10] for i in range(8) if i != 3]
    assert [(s.index, s.stage) for s in loader.skipped_samples] == [(3, "fetch")]


def test_workers_started_from_a_short_lived_thread_outlive_it(start_method: str) -> None:
    # PR_SET_PDEATHSIG follows the thread that forked: an evaluation thread that
    # first iterates a persistent loader must not take its workers with it.
    import threading

    loader = DataLoader(
        list(range(8)), batch_size=4, num_workers=2, persistent_workers=True,
        multiprocessing_context=start_method,
    )  # fmt: skip
    first: list[list[int]] = []
    thread = threading.Thread(target=lambda: first.extend(b.tolist() for b in loader))
    thread.start()
    thread.join()
    stats = loader.statistics()
    assert stats is not None
    pids = [w.pid for w in stats.workers]
    second = [b.tolist() for b in loader]  # the next epoch, in the main thread
    assert first == second == [[0, 1, 2, 3], [4, 5, 6, 7]]
    stats = loader.statistics()
    assert stats is not None
    assert (stats.worker_restarts, [w.pid for w in stats.workers]) == (0, pids)


def test_a_sample_only_killed_from_outside_needs_more_evidence_and_is_retried_next_epoch() -> None:
    # SIGKILL is what the OOM killer (or an operator) sends: weak evidence. The sample
    # must kill a fresh worker alone twice to be accused; and it is tried again in the
    # next epoch instead of being left out for good. The default restart budget (3)
    # is enough: deaths proven to be the sample's are not charged to it.
    loader = _loader(Flaky(8, kill={3}), on_error="skip", persistent_workers=True)
    with pytest.warns(WorkerRestartedWarning) as record:
        first = list(loader)
    assert first == [[0, 1], [2], [4, 5], [6, 7]]
    assert len(record) == 4  # four deaths, each replaced
    (skip,) = loader.skipped_samples
    assert (skip.index, skip.stage) == (3, "killed")
    assert skip.message.startswith("killed its worker 4 times: killed by signal SIGKILL (-9)")
    with pytest.warns(WorkerRestartedWarning):  # tried again: it dies again
        assert list(loader) == first
    assert [(s.index, s.epoch, s.stage) for s in loader.skipped_samples] == [
        (3, 0, "killed"),
        (3, 1, "killed"),
    ]
