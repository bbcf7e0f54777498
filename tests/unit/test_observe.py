"""Stage timings, the verdict, the progress line and the trace: pure parts, no loader."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from conveyor.observe.autotune import Autotuner, Limits
from conveyor.observe.progress import EVERY_S, ProgressLine, line
from conveyor.observe.timings import StageClock
from conveyor.observe.trace import Tracer
from conveyor.observe.verdict import Cause, diagnose
from conveyor.records import LoaderStatistics, StageTimes, WorkerStatistics

MIB = 1 << 20


def test_the_stage_clock_keeps_epochs_and_the_loaders_life_apart() -> None:
    clock = StageClock(now=100.0, num_workers=2)
    clock.worked(0, busy_s=0.5, fetch_s=0.3, collate_s=0.1, send_s=0.05, nbytes=1000)
    clock.handed_out(samples=32, decode_s=0.01)
    clock.waited(0.2)
    first = clock.epoch(now=101.0)
    assert (first.seconds, first.batches, first.samples, first.bytes) == (1.0, 1, 32, 1000)
    assert (first.fetch_s, first.collate_s, first.send_s, first.busy_s) == (0.3, 0.1, 0.05, 0.5)
    assert (first.decode_s, first.wait_s, first.wait_share) == (0.01, 0.2, 0.2)
    clock.new_epoch(now=101.0)
    clock.worked(1, busy_s=0.25, fetch_s=0.2, collate_s=0.0, send_s=0.0)
    clock.handed_out(samples=16)
    second = clock.epoch(now=103.0)
    assert (second.seconds, second.batches, second.samples, second.busy_s) == (2.0, 1, 16, 0.25)
    assert clock.worker_busy == [0.0, 0.25] and clock.worker_busy_total == [0.5, 0.25]
    total = clock.total(now=103.0)
    assert (total.seconds, total.batches, total.samples, total.busy_s) == (3.0, 2, 48, 0.75)


def _stats(
    *,
    seconds: float = 10.0,
    wait_s: float = 0.0,
    busy_s: float = 0.0,
    fetch_s: float = 0.0,
    collate_s: float = 0.0,
    decode_s: float = 0.0,
    workers: int = 4,
    active_s: float | None = None,
    memory: int | None = None,
) -> LoaderStatistics:
    stages = StageTimes(
        seconds=seconds, batches=100, samples=3200, fetch_s=fetch_s, collate_s=collate_s,
        busy_s=busy_s, decode_s=decode_s, wait_s=wait_s,
    )  # fmt: skip
    per_worker = tuple(
        WorkerStatistics(i, 1000 + i, 25, 800, 0, 80.0, busy_s / workers / seconds,
                         None if active_s is None else active_s / workers, memory)
        for i in range(workers)
    )  # fmt: skip
    return LoaderStatistics(0, 100, 3200, 0, 0, 0, (), per_worker, stages, stages)


# One row per verdict: the figures of a loader with that bottleneck, and what must be said.
VERDICTS = [
    pytest.param(
        dict(wait_s=0.1, busy_s=12.0, fetch_s=11.0, memory=300 * MIB),
        Cause.TRAINING,
        ["not the bottleneck", "waited for data 1%", "num_workers=3", "free 1 cores", "300 MiB"],
        id="training-bound",
    ),
    pytest.param(
        dict(wait_s=6.0, busy_s=8.0, fetch_s=7.0, decode_s=5.0),
        Cause.MAIN_PROCESS,
        ["main process holds", "60% of the time", "busy only 20%", "50.00 ms a batch"],
        id="main-process-bound",
    ),
    pytest.param(
        dict(wait_s=5.0, busy_s=39.0, fetch_s=9.0, collate_s=29.0, active_s=38.0),
        Cause.COLLATE,
        ["collate_fn holds", "76% of their time in collate_fn", "290.00 ms a batch"],
        id="collate-bound",
    ),
    pytest.param(
        dict(wait_s=5.0, busy_s=39.0, fetch_s=38.0, active_s=4.0),
        Cause.WAITING,
        ["mostly wait", "computing only 10%", "worker_method='thread'"],
        id="io-bound",
    ),
    pytest.param(
        dict(wait_s=5.0, busy_s=39.0, fetch_s=38.0, active_s=38.0),
        Cause.FETCH,
        ["Fetching samples holds", "may use 8 CPUs", "num_workers to 8"],
        id="fetch-bound",
    ),
]


@pytest.mark.parametrize(("figures", "cause", "said"), VERDICTS)
def test_each_bottleneck_gets_its_verdict_with_the_figures(
    figures: dict[str, Any], cause: Cause, said: list[str]
) -> None:
    verdict = diagnose(_stats(**figures), cpus=8)
    assert verdict.cause is cause, verdict.text
    for words in said:
        assert words in verdict.text, verdict.text


def test_fetch_bound_at_every_core_says_so() -> None:
    verdict = diagnose(_stats(wait_s=5.0, busy_s=39.0, fetch_s=38.0, active_s=38.0), cpus=4)
    assert verdict.cause is Cause.CORES and "every core is in use" in verdict.text


def test_too_little_measured_says_so() -> None:
    empty = LoaderStatistics(0, 0, 0, 0, 0, 0, (), ())
    assert diagnose(empty, cpus=2).cause is Cause.UNKNOWN


def test_as_dict_is_flat_numbers_for_a_logger() -> None:
    flat = _stats(wait_s=2.0, busy_s=20.0, fetch_s=18.0).as_dict()
    assert all(isinstance(v, (int, float)) for v in flat.values())
    assert flat["epoch/wait_share"] == 0.2 and flat["total/samples_per_s"] == 320.0
    assert flat["epoch/fetch_ms_per_batch"] == 180.0 and flat["workers"] == 4


def test_the_progress_line_without_tqdm_is_logged_every_period(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("conveyor.observe.progress.time.monotonic", lambda: clock[0])
    stats = _stats(wait_s=1.0)
    bar = ProgressLine(total=200, use_tqdm=False)
    with caplog.at_level(logging.INFO, logger="conveyor"):
        bar.batch(lambda: stats)  # within the first period: nothing yet
        assert caplog.messages == []
        clock[0] = EVERY_S + 0.1
        bar.batch(lambda: stats)
        bar.batch(lambda: stats)  # the next line only a period later
        bar.close(stats)
    expected = line(stats, 200)
    assert caplog.messages == [expected, expected]
    assert expected == (
        "epoch 0: 100/200 batches, 320 samples/s, loop waiting 10%, 0 restarts, 0 skipped"
    )


def test_a_trace_is_trace_event_json_with_a_lane_per_worker(tmp_path: Path) -> None:
    tracer = Tracer()
    tracer.main_span("wait", 10.0, 0.002)
    tracer.worker_span(0, 4242, "fetch", 9.99, 0.005, seq=3)
    tracer.worker_span(1, 4343, "collate", 9.995, 0.001)
    tracer.worker_span(0, None, "fetch", 10.1, 0.005)  # a thread worker: no pid of its own
    document = json.loads(tracer.write(tmp_path / "run.json").read_text())
    events = document["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {(e["name"], e["ts"], e["dur"]) for e in spans} >= {("wait", 10e6, 2000.0)}
    assert all(set(e) >= {"name", "ph", "pid", "tid", "ts", "dur"} for e in spans)
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(lanes.values()) == ["training loop", "worker 0", "worker 0", "worker 1"]
    assert {(e["pid"], e["tid"]) for e in spans} == set(lanes)


# --- num_workers="auto" -------------------------------------------------------------------


def _window(wait_share: float, busy_share: float, workers: int) -> StageTimes:
    return StageTimes(
        seconds=2.0, batches=40, samples=1280, wait_s=2.0 * wait_share,
        busy_s=2.0 * busy_share * workers,
    )  # fmt: skip


def test_autotune_starts_from_the_usable_cpus() -> None:
    assert Autotuner(Limits(cpus=6, most=64)).first().change == 6
    assert Autotuner(Limits(cpus=6, most=64), threads=True).first().change == 12
    assert Autotuner(Limits(cpus=6, most=4)).first().change == 4


@pytest.mark.parametrize(
    ("wait", "busy", "workers", "memory", "change", "words"),
    [
        (0.30, 0.95, 2, None, 1, "added a worker: the loop waited 30%"),
        (0.30, 0.95, 4, None, 0, "one per usable CPU, 4"),  # processes: at the CPUs
        (0.30, 0.50, 2, None, 0, "kept 2 workers"),  # waiting, but not on the workers
        (0.01, 0.20, 3, None, -1, "retired a worker"),
        (0.01, 0.20, 1, None, 0, "kept 1 workers"),  # never below one
        (0.01, 0.60, 3, None, 0, "kept 3 workers"),
        (0.30, 0.95, 2, (600 << 20, 500 << 20), 0, "would not fit the memory left (500 MiB)"),
        (0.30, 0.95, 2, (100 << 20, 500 << 20), 1, "added a worker"),
    ],
)
def test_autotune_adds_while_the_loop_waits_for_busy_workers_within_the_budget(
    wait: float,
    busy: float,
    workers: int,
    memory: tuple[int, int] | None,
    change: int,
    words: str,
) -> None:
    tuner = Autotuner(Limits(cpus=4, most=64))
    worker_memory, left = memory if memory is not None else (None, None)
    decision = tuner.decide(_window(wait, busy, workers), workers, worker_memory, left)
    assert decision.change == change and words in decision.why, decision.why


def test_autotune_settles_after_windows_without_a_change() -> None:
    tuner = Autotuner(Limits(cpus=4, most=64))
    tuner.decide(_window(0.3, 0.95, 2), 2)
    assert not tuner.settled
    for _ in range(3):
        tuner.decide(_window(0.01, 0.6, 3), 3)
    assert tuner.settled
    assert [count for count, _ in tuner.history] == [3]
