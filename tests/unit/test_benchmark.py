"""The benchmark harness: workload datasets, measurement, report, and the CLI end to end.

Timings are never asserted; only that the runs happen and produce sane, positive numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conveyor.benchmark import (
    WORKLOADS,
    BenchOptions,
    BenchReport,
    Measurement,
    Row,
    render,
    workloads,
)
from conveyor.benchmark.measure import PlainLoop, WindowSpec, measure_throughput, touch
from conveyor.benchmark.report import to_json
from conveyor.benchmark.workloads import (
    CpuDataset,
    ImageDataset,
    MapDataset,
    PathListDataset,
    SleepDataset,
    TinyDataset,
    calibrate_spin,
    hand_collate,
)
from conveyor.cli import main

# --- workloads -------------------------------------------------------------------------------


def test_tiny_sample_is_16_float32_and_int_label() -> None:
    ds = TinyDataset(1000)
    value, label = ds[999]
    assert len(ds) == 1000
    assert value.shape == (16,) and value.dtype == np.float32
    assert (type(label), label) == (int, 9)  # index % 10


def test_image_sample_is_3x224x224_uint8() -> None:
    value, label = ImageDataset(10)[7]
    assert value.shape == (3, 224, 224) and value.dtype == np.uint8
    assert (type(label), label) == (int, 7)  # index % 1000


def test_cpu_sample_is_a_small_vector() -> None:
    value, label = CpuDataset(5, iterations=100)[4]
    assert value.shape == (8,) and value.dtype == np.float32
    assert (type(label), label) == (int, 4)  # index % 10


def test_calibrated_spin_scales_the_best_trial_to_the_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A clock on which the two trials of spin(20_000) take 4 ms, then 2 ms: the best is
    # 2 ms, so 0.5 ms takes a quarter of 20_000 iterations.
    ticks = iter([10.0, 10.004, 20.0, 20.002])
    monkeypatch.setattr(workloads.time, "perf_counter", lambda: next(ticks))
    assert calibrate_spin(target_s=0.0005, trials=2) == 5_000
    assert next(ticks, None) is None  # one start and one end per trial


def test_latency_sample_is_a_small_vector() -> None:
    value, label = SleepDataset(3, delay_s=0.0)[2]
    assert value.shape == (8,) and value.dtype == np.float32
    assert label == 2


def test_startup_dataset_holds_path_strings() -> None:
    ds = PathListDataset(100)
    assert len(ds) == 100
    assert ds[42] == ("/data/train/0000042.jpg", 42)


@pytest.mark.parametrize("dataset", [TinyDataset(4), ImageDataset(4), SleepDataset(4, 0.0)])
def test_index_past_the_end_raises_index_error(dataset: MapDataset) -> None:
    with pytest.raises(IndexError):
        dataset[4]


def test_hand_collate_stacks_values_and_labels() -> None:
    ds = TinyDataset(8)
    values, labels = hand_collate([ds[i] for i in range(8)])
    assert values.shape == (8, 16) and labels.shape == (8,) and labels.dtype == np.int64


def test_workloads_match_the_documented_settings() -> None:
    settings = {
        name: (spec.batch_size, spec.num_workers, spec.persistent_workers)
        for name, spec in WORKLOADS.items()
    }
    assert settings == {
        "tiny": (256, 2, True),
        "image": (64, 2, True),
        "cpu": (32, 2, False),
        "latency": (16, 8, False),
        "startup": (32, 2, False),
    }
    assert WORKLOADS["startup"].start_method == "spawn"
    assert WORKLOADS["latency"].ideal_samples_per_s == pytest.approx(1600)


# --- measurement and report ------------------------------------------------------------------


def test_measure_counts_the_timed_batches_only() -> None:
    window = WindowSpec(warmup=2, min_batches=3, max_batches=3, seconds=0.0)
    result = measure_throughput(lambda: PlainLoop(TinyDataset(40), 4), window)
    assert (result.batches, result.samples) == (3, 12)
    assert result.samples_per_s > 0 and result.leaked_processes == 0
    assert result.peak_rss_bytes is not None and result.peak_rss_bytes > 0


def test_touch_returns_the_batch_length() -> None:
    assert touch((np.zeros((5, 3)), np.arange(5))) == 5
    assert touch([["a", "b"], np.arange(2)]) == 2


@pytest.mark.parametrize(
    "kwargs", [{"workloads": ("nope",)}, {"repeat": 0}, {"start_method": "teleport"}]
)
def test_bad_options_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        BenchOptions(**kwargs)  # type: ignore[arg-type]


def _fake(seconds: float, samples: int = 100) -> Measurement:
    return Measurement(10, samples, seconds, 0.01, 2**20, 0)


def test_report_renders_rows_ratios_and_failures() -> None:
    rows = [
        Row("tiny", "2 workers", "throughput", {"conveyor": [_fake(1.0)], "torch": [_fake(2.0)]}),
        Row("tiny", "plain", "baseline", {"plain": [_fake(0.5)]}, notes=["200 samples/s"]),
        Row("startup", "spawn", "startup", {"conveyor": [_fake(1.0)], "torch": [_fake(3.0)]}),
        Row("cpu", "2 workers", "throughput", {"torch": [_fake(1.0)]}, {"conveyor": "Boom: x"}),
    ]
    report = BenchReport({"cores": "2"}, BenchOptions(), rows)
    text = render(report)
    assert "| tiny | 2 workers | 100 | 50 | 2.00x |" in text
    assert "| startup | spawn | 1.00 s | 3.00 s | 3.00x |" in text
    assert "| cpu | 2 workers | error | 100 | - |" in text
    assert json.loads(json.dumps(to_json(report)))["rows"][0]["ratio"] == 2.0


def test_cli_rejects_an_unknown_workload(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--workloads", "tiny,nope"])
    assert exit_info.value.code == 2
    assert "choose from tiny, image" in capsys.readouterr().err


# --- end to end ------------------------------------------------------------------------------


def _table_rows(markdown: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in WORKLOADS:
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def _number(cell: str) -> float:
    return float(cell.replace(",", "").removesuffix("x").removesuffix(" s"))


FEATURES_CONFIG = "2 workers, persistent, reseed='batch', on_error='skip', snapshot every step"


def test_cli_quick_run_prints_the_table_and_saves_json(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "conveyor.cli", "bench", "--quick"]
    command += ["--workloads", "tiny,latency", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    rows = _table_rows(done.stdout)
    assert set(rows) == {
        ("tiny", "2 workers, persistent"),
        ("tiny", "num_workers=0"),
        ("tiny", "plain loop, no loader (ceiling)"),
        ("tiny", "reference loop, 2 fork workers, shared memory"),
        ("tiny", FEATURES_CONFIG),
        ("latency", "8 workers"),
    }
    for (_, config), (mine, theirs, ratio, notes) in rows.items():
        if config.startswith(("plain", "reference")):
            assert _number(notes.split()[0]) > 0
        elif config == FEATURES_CONFIG:  # conveyor's own options: no torch column
            assert _number(mine) > 0 and theirs == "-"
            assert "of the same loader without them:" in notes
        else:
            assert _number(mine) > 0 and _number(theirs) > 0 and _number(ratio) > 0, notes
    assert "of ideal 1,600/s" in rows[("latency", "8 workers")][3]
    workers_notes = rows[("tiny", "2 workers, persistent")][3]
    assert "of reference loop: conveyor" in workers_notes
    assert "vs its num_workers=0: conveyor" in workers_notes
    assert "outlived" not in done.stdout and "failed" not in done.stdout
    saved = json.loads(out.read_text())
    assert {row["workload"] for row in saved["rows"]} == {"tiny", "latency"}
    assert saved["environment"]["conveyor column"] == "conveyor.DataLoader"


def test_reference_loop_delivers_every_batch_in_order_and_leaves_no_process() -> None:
    from tests.helpers.leaks import no_leaks

    from conveyor.benchmark.reference import SharedMemoryLoop
    from conveyor.benchmark.workloads import TinyDataset

    dataset = TinyDataset(10 * 8 + 3)  # a partial last batch is dropped
    with no_leaks():
        batches = [
            (values.tolist(), labels.tolist())
            for values, labels in SharedMemoryLoop(dataset, 8, num_workers=3)
        ]
        early = iter(SharedMemoryLoop(dataset, 8, num_workers=2))
        next(early)
        early.close()  # stopped mid-way: its workers still exit
    assert len(batches) == 10
    for number, (values, labels) in enumerate(batches):
        indices = range(number * 8, number * 8 + 8)
        assert values == [dataset[i][0].tolist() for i in indices]
        assert labels == [dataset[i][1] for i in indices]
