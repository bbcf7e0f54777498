"""The benchmark harness: workload datasets, measurement, report, and the CLI end to end.

Timings are never asserted; only that the runs happen and produce sane, positive numbers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conveyor import cli
from conveyor.cli import main
from conveyor_bench import (
    WORKLOADS,
    BenchOptions,
    BenchReport,
    Measurement,
    Row,
    catalogue,
    render,
    run_benchmark,
    runner,
    workloads,
)
from conveyor_bench import notes as benchmark_notes
from conveyor_bench.loaders import row_methods
from conveyor_bench.measure import (
    Accelerator,
    PlainLoop,
    WindowSpec,
    measure_epochs,
    measure_throughput,
    measure_training,
    touch,
)
from conveyor_bench.plot import MatplotlibMissingError, plot_report
from conveyor_bench.report import to_json
from conveyor_bench.specs import QUICK_CALL_BATCHES
from conveyor_bench.workloads import (
    CpuDataset,
    ImageDataset,
    MapDataset,
    PathListDataset,
    SleepDataset,
    TinyDataset,
    calibrate_spin,
    hand_collate,
)

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
        "fresh": (64, 2, True),
        "decode": (64, 2, True),
        "cpu": (32, 2, False),
        "text": (64, 2, True),
        "big": (16, 2, True),
        "memory": (64, 2, True),
        "latency": (16, 8, False),
        "remote": (16, 8, True),
        "startup": (32, 2, False),
        "epochs": (256, 2, False),
        "train": (64, 2, True),
        "host": (16, 2, True),
        "torchvision": (64, 2, True),
        "torchvision-io": (64, 2, True),
        "ray": (64, 2, True),
    }
    # The targets (issue 24), printed beside the figures.
    assert WORKLOADS["cpu"].target_speedup == 1.9
    assert WORKLOADS["decode"].machine_target
    assert WORKLOADS["text"].target_vs_inline == 1.7
    # Issue 36's: tiny's workers at least its num_workers=0; issue 40's: CPU per batch over
    # the reference loop's at most 1.25x (main process) and 1.05x (workers; 36's were 1.5x
    # and 1.15x), and memory at most 1.1x torch's with 2, 4 and 8 workers.
    assert {n for n, spec in WORKLOADS.items() if spec.target_vs_inline == 1.0} == {
        "decode",
        "cpu",
        "tiny",
    }
    ceilings = {
        n: (spec.target_main_of_reference, spec.target_workers_of_reference)
        for n, spec in WORKLOADS.items()
        if spec.target_main_of_reference is not None
    }
    assert ceilings == {name: (1.25, 1.05) for name in ("tiny", "image", "fresh")}
    assert WORKLOADS["memory"].worker_counts == (2, 4, 8)
    assert WORKLOADS["memory"].target_memory_of_torch == 1.1
    assert {n for n, spec in WORKLOADS.items() if spec.alternatives} == {
        "tiny",
        "image",
        "fresh",
        "decode",
        "cpu",
    }
    heavy = ("decode", "big", "memory", "remote", "host", "torchvision", "torchvision-io", "ray")
    assert tuple(n for n in WORKLOADS if n not in heavy) == (catalogue.QUICK_WORKLOADS)
    # ray starts a Ray cluster: only when named (issue 27).
    assert tuple(n for n in WORKLOADS if n != "ray") == catalogue.DEFAULT_WORKLOADS
    assert WORKLOADS["startup"].start_methods == ("spawn",)
    assert WORKLOADS["epochs"].start_methods == ("fork", "spawn")
    assert WORKLOADS["startup"].quick_start_methods == ("fork",)
    assert WORKLOADS["epochs"].quick_start_methods == ("fork",)
    assert WORKLOADS["epochs"].fixed_length == 10 * 256  # 10 batches an epoch
    assert WORKLOADS["latency"].ideal_samples_per_s == pytest.approx(1600)
    assert WORKLOADS["train"].step_s == 0.005
    assert WORKLOADS["train"].ideal_samples_per_s == pytest.approx(64 / 0.005)
    # Issue 25's rows: 4 processes x 16 threads for remote reads, the SPDL effect (host).
    assert [v.label for v in WORKLOADS["remote"].variants][1] == "4 processes x 16 threads"
    assert WORKLOADS["host"].step_holds_gil and WORKLOADS["host"].step_s == 0.005
    # Issue 33's rows: torch's processes, conveyor's, its threads and processes of threads.
    for name in ("torchvision", "torchvision-io"):
        assert [v.label for v in WORKLOADS[name].variants] == [
            "2 thread workers",
            "2 processes x 2 threads",
        ]
        assert WORKLOADS[name].measure_memory


def test_the_ray_workload_without_ray_says_so_on_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    report = run_benchmark(BenchOptions(workloads=("ray",), quick=True, repeat=1), progress=None)
    (row,) = report.rows
    assert row.workload == "ray" and row.notes == ["skipped: ray not installed"]
    assert not row.runs


# --- measurement and report ------------------------------------------------------------------


def test_quick_window_of_epochs_runs_at_least_one_within_its_seconds() -> None:
    assert WORKLOADS["epochs"].window(quick=True, seconds=3.0) == WindowSpec(0, 1, 3, 0.2)
    assert WORKLOADS["epochs"].window(quick=False, seconds=3.0) == WindowSpec(1, 2, 500, 3.0)
    # A throughput window also counts the main process's calls over a few batches first.
    assert WORKLOADS["tiny"].window(quick=True, seconds=3.0) == WindowSpec(
        10, 40, 40, 0.0, count_calls=QUICK_CALL_BATCHES
    )


def test_measure_counts_the_timed_batches_only() -> None:
    window = WindowSpec(warmup=2, min_batches=3, max_batches=3, seconds=0.0)
    result = measure_throughput(lambda: PlainLoop(TinyDataset(40), 4), window)
    assert (result.batches, result.samples) == (3, 12)
    assert result.samples_per_s > 0 and result.leaked_processes == 0
    assert result.peak_rss_bytes is not None and result.peak_rss_bytes > 0


class _Epochs:
    """A loader stand-in: each ``iter()`` is an epoch of ``batches`` plain batches."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.epochs_started = 0

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self.epochs_started += 1
        for _ in range(self.batches):
            yield np.zeros((4, 2)), np.arange(4)


def test_measure_epochs_times_whole_epochs_after_the_warmup() -> None:
    loader = _Epochs(batches=3)
    result = measure_epochs(lambda: loader, WindowSpec(1, 2, 2, seconds=0.0))
    assert loader.epochs_started == 3  # one warm-up epoch, then two timed
    assert (result.epochs, result.batches, result.samples) == (2, 6, 24)
    assert result.seconds_per_epoch == pytest.approx(result.seconds / 2)
    assert result.peak_rss_bytes is not None and result.leaked_processes == 0


def test_touch_returns_the_batch_length() -> None:
    assert touch((np.zeros((5, 3)), np.arange(5))) == 5
    assert touch([["a", "b"], np.arange(2)]) == 2


@pytest.mark.parametrize(
    "kwargs", [{"workloads": ("nope",)}, {"repeat": 0}, {"start_method": "teleport"}]
)
def test_bad_options_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        BenchOptions(**kwargs)  # type: ignore[arg-type]


def _fake(seconds: float, samples: int = 100, epochs: int = 0) -> Measurement:
    return Measurement(10, samples, seconds, 0.01, 2**20, 0, epochs=epochs)


def test_auto_rows_say_how_long_the_count_took_to_settle() -> None:
    def settled(after: float | None, waited: bool = True, workers: int = 2) -> Measurement:
        return dataclasses.replace(
            _fake(1.0),
            settled_after_s=after,
            settled_workers=None if after is None else workers,
            waited_to_settle=waited,
        )

    notes = benchmark_notes._settle_notes
    assert notes([settled(4.0), settled(6.5), settled(5.0, workers=3)]) == [
        "auto settled at 2/3 workers after 5.0 s (median), timed after"
    ]
    assert notes([settled(4.0), settled(None)]) == [
        "auto settled in 1 of 2 runs within 30 s; the others were timed while it adapted"
    ]
    assert notes([settled(None, waited=False)]) == []  # --quick does not wait for it


def test_memory_notes_give_what_each_loader_added_and_where() -> None:
    def held(mib: int, in_workers: int) -> Measurement:
        mem = {"loader_pss_bytes": mib * 2**20, "workers_pss_bytes": in_workers * 2**20}
        return dataclasses.replace(_fake(1.0), **mem)

    workers = Row("remote", "8 workers", "throughput",
                  {"conveyor": [held(80, 70), held(90, 80)], "torch": [held(100, 90)]})  # fmt: skip
    threads = Row("remote", "64 thread workers", "variant", {"conveyor": [held(17, 0)]})
    notes = benchmark_notes._memory_notes
    assert notes(workers, workers) == [
        "memory the loader added (PSS, shared pages split): conveyor 85 MiB (workers 75, "
        "this process +10), torch 100 MiB (workers 90, this process +10)"
    ]
    assert notes(threads, workers) == [
        "memory the loader added (PSS, shared pages split): conveyor 17 MiB (all in this "
        "process); 0.20x the workers row's"
    ]
    assert notes(Row("tiny", "2 workers", "throughput", {"conveyor": [_fake(1.0)]}), None) == []


def test_rows_that_measure_memory_give_each_loaders_charged_peak_against_the_target() -> None:
    # PSS at the window's end misses what torch's workers hold only between batches (a
    # batch's samples, shared memory in transit); the cgroup's peak does not.
    def charged(mib: int) -> Measurement:
        return dataclasses.replace(_fake(1.0), charged_peak_bytes=mib * 2**20)

    spec = dataclasses.replace(WORKLOADS["image"], target_memory_of_torch=1.1)
    row = Row("image", "2 workers", "throughput",
              {"conveyor": [charged(210), charged(230)], "torch": [charged(200)]})  # fmt: skip
    assert benchmark_notes._charged_notes(spec, row) == [
        "peak as charged to a memory cgroup: conveyor 220 MiB, torch 200 MiB",
        "conveyor over torch: 1.10x (target <= 1.1x)",
    ]
    over = Row("image", "2 workers", "throughput",
               {"conveyor": [charged(300)], "torch": [charged(200)]})  # fmt: skip
    assert benchmark_notes._charged_notes(spec, over)[1] == (
        "conveyor over torch: 1.50x (over target <= 1.1x)"
    )
    alone = Row("image", "2 thread workers", "variant", {"conveyor": [charged(90)]})
    assert benchmark_notes._charged_notes(spec, alone) == [
        "peak as charged to a memory cgroup: conveyor 90 MiB"
    ]
    unread = Row("image", "2 workers", "throughput", {"conveyor": [_fake(1.0)]})
    assert benchmark_notes._charged_notes(spec, unread) == []


def test_a_variant_of_processes_of_threads_is_held_to_the_ideal_of_all_its_threads() -> None:
    remote = WORKLOADS["remote"]
    row = Row("remote", "4 processes x 16 threads", "variant", {"conveyor": [_fake(1.0)]})
    assert benchmark_notes._worker_count(remote, row) == 64


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


def test_cpu_per_batch_is_shown_against_the_reference_loops() -> None:
    """Main and workers CPU per batch of every loader row, over the reference loop's; the
    workers row's note holds conveyor's against the issue's ceilings (made-up numbers)."""

    def cpu(main_s: float, workers_s: float | None) -> Measurement:
        return dataclasses.replace(
            _fake(1.0),
            main_cpu_s=main_s,
            workers_cpu_s=workers_s,
            worker_processes=0 if workers_s is None else 2,
        )

    # 10 batches a run: CPU seconds / 10 = ms per batch * 100.
    rows = [
        Row("fresh", "2 workers", "throughput", {"conveyor": [cpu(0.002, 0.012)]}),
        Row("fresh", runner.INLINE_CONFIG, "throughput", {"conveyor": [cpu(0.02, None)]}),
        Row("fresh", "reference loop", "reference", {"reference": [cpu(0.001, 0.01)]}),
        Row("text", "2 workers", "throughput", {"conveyor": [cpu(0.003, 0.004)]}),
    ]
    benchmark_notes.annotate(WORKLOADS["fresh"], rows[:3])
    assert rows[0].notes[-1] == (
        "CPU per batch over the reference loop's: main conveyor 2.00x (over target <= 1.25x); "
        "workers conveyor 1.20x (over target <= 1.05x)"
    )
    text = render(BenchReport({"cores": "2"}, BenchOptions(), rows))
    assert "| fresh | 2 workers | conveyor | 0.20 | 1.20 | 2.00x | 1.20x | 1.27x |" in text
    assert "| fresh | num_workers=0 | conveyor | 2.00 | - | 20.00x | - | 1.82x |" in text
    assert "| fresh | reference loop | reference | 0.10 | 1.00 | 1.00x | 1.00x | 1.00x |" in text
    assert "| text | 2 workers | conveyor | 0.30 | 0.40 | - | - | - |" in text


def test_summary_shows_each_figure_with_its_spread_over_the_rounds() -> None:
    # conveyor's rounds: 90, 100, 104 samples/s (median 100, farthest 10% off); torch's
    # epochs: 0.2 s, 0.25 s, 0.3 s for two epochs each (median 125 ms an epoch, 20% off).
    conveyor = [_fake(100 / v) for v in (90, 100, 104)]
    epochs = [_fake(s, epochs=2) for s in (0.2, 0.25, 0.3)]
    rows = [
        Row("tiny", "2 workers", "throughput", {"conveyor": conveyor}),
        Row("epochs", "fork", "epochs", {"conveyor": epochs[:1], "torch": epochs}),
    ]
    text = render(BenchReport({"cores": "2"}, BenchOptions(repeat=3), rows))
    assert "| tiny | 2 workers | 100 ±10% | - | - |" in text
    assert "| epochs | fork | 100 ms | 125 ms ±20% | 1.25x |" in text  # torch / conveyor
    assert "3 alternating rounds, median shown, ±: the farthest round from it" in text
    saved = to_json(BenchReport({}, BenchOptions(repeat=3), rows))["rows"]
    assert saved[0]["results"]["conveyor"]["spread"] == pytest.approx(0.10)
    assert saved[1]["results"]["torch"]["unit"] == "seconds per epoch"


def _plot_report() -> BenchReport:
    """A report as a run of every kind of row would give, with made-up numbers."""
    rounds = {"conveyor": [_fake(1.0), _fake(1.1)], "torch": [_fake(2.0), _fake(2.4)]}
    rows = [
        Row("tiny", "2 workers, persistent", "throughput", rounds),
        Row("tiny", runner.INLINE_CONFIG, "throughput", {"conveyor": [_fake(1.5)]}),
        Row("tiny", "reference loop", "reference", {"reference": [_fake(0.8)]}),
        Row("latency", "8 workers", "throughput", {"conveyor": [_fake(50.0)]}, {"torch": "X"}),
        Row("startup", "2 workers, spawn", "startup", rounds),
        Row("epochs", "2 workers, fork", "epochs", {"conveyor": [_fake(0.3, epochs=10)]}),
    ]
    return BenchReport({"cores": "2 logical"}, BenchOptions(repeat=2), rows)


@pytest.mark.slow  # with the framework tests: CI installs matplotlib for that run
def test_plot_draws_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="needs matplotlib (CI installs it for -m slow)")
    target = tmp_path / "bench.png"
    assert plot_report(_plot_report(), target) == target
    assert target.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_without_matplotlib_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    target = tmp_path / "bench.png"
    with pytest.raises(MatplotlibMissingError, match="pip install matplotlib"):
        plot_report(_plot_report(), target)
    assert not target.exists()


def test_cli_plot_without_matplotlib_fails_before_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    ran: list[BenchOptions] = []
    monkeypatch.setattr("conveyor_bench.command.run_benchmark", ran.append)
    assert main(["bench", "--quick", "--plot", str(tmp_path / "bench.png")]) == 2
    assert ran == []
    assert "pip install matplotlib" in capsys.readouterr().err


def test_plot_of_a_report_with_no_figure_is_refused(tmp_path: Path) -> None:
    failed = Row("tiny", "2 workers", "throughput", errors={"conveyor": "Boom: x"})
    report = BenchReport({}, BenchOptions(), [failed])
    with pytest.raises(ValueError, match="no figure to plot"):
        plot_report(report, tmp_path / "bench.png")


def test_cli_rejects_an_unknown_workload(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--workloads", "tiny,nope"])
    assert exit_info.value.code == 2
    assert "choose from tiny, image" in capsys.readouterr().err


def _harness_off_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in an environment with conveyor installed but benchmarks/ not on sys.path."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).name != "benchmarks"])
    for name in [n for n in sys.modules if n.split(".")[0] == "conveyor_bench"]:
        monkeypatch.delitem(sys.modules, name)


def test_cli_finds_the_harness_in_the_clone_conveyor_is_installed_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _harness_off_path(monkeypatch)
    harness = cli._bench_harness()
    assert harness is not None
    assert Path(harness.__file__).parent.parent == cli._CLONE_BENCHMARKS


def test_cli_without_a_clone_says_where_the_benchmark_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _harness_off_path(monkeypatch)
    monkeypatch.setattr(cli, "_CLONE_BENCHMARKS", tmp_path / "benchmarks")
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "runs from a clone of conveyor's repository" in err
    assert "pip install -e ." in err


# --- end to end ------------------------------------------------------------------------------


def _table_rows(markdown: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in WORKLOADS:
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def _number(cell: str) -> float:
    """A cell's figure: '1,234', '1,234 ±3%', '0.51 s', '24 ms' or '1.20x'."""
    figure = cell.split(" ±")[0].replace(",", "").removesuffix("x")
    return float(figure.removesuffix(" s").removesuffix(" ms"))


FEATURES_CONFIG = "2 workers, persistent, reseed='batch', on_error='skip', snapshot every step"


@pytest.mark.slow  # runs `conveyor bench --quick` whole (about 8 s): CI's slow run
def test_cli_quick_run_prints_the_table_and_saves_json(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "conveyor.cli", "bench", "--quick"]
    command += ["--workloads", "tiny,latency", "--json", str(out)]
    plot = tmp_path / "bench.png"
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    if has_matplotlib:  # without it --plot fails before the run (tested above)
        command += ["--plot", str(plot)]
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
        ("latency", "num_workers='auto'"),
    }
    for (_, config), (mine, theirs, ratio, notes) in rows.items():
        if config.startswith(("plain", "reference")):
            assert _number(notes.split()[0]) > 0
        elif config == FEATURES_CONFIG:  # conveyor's own options: no torch column
            assert _number(mine) > 0 and theirs == "-"
            assert "of the same loader without them:" in notes
        elif config == "num_workers='auto'":  # conveyor alone, another worker count
            assert _number(mine) > 0 and theirs == "-"
            assert "x conveyor's workers row above" in notes
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
    if has_matplotlib:
        assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_epochs_row_times_short_epochs_of_both_loaders() -> None:
    pytest.importorskip("torch")
    # --quick runs fork only: a spawned torch worker imports torch, seconds an epoch.
    options = BenchOptions(workloads=("epochs",), quick=True, repeat=2)
    [row] = runner.run_benchmark(options, progress=None).rows
    assert (row.kind, row.config) == ("epochs", "2 workers, fork, 10 batches an epoch")
    assert row.errors == {}
    for loader in ("conveyor", "torch"):
        runs = row.runs[loader]
        assert len(runs) == 2  # one a round
        assert all(m.epochs >= 1 and m.batches == 10 * m.epochs for m in runs)
        assert all(m.samples == 2560 * m.epochs and m.leaked_processes == 0 for m in runs)
    ratio = row.ratio()
    assert ratio is not None and ratio > 0
    assert "start-up included" in row.notes[0]


def test_measure_training_times_the_loop_and_its_waits_for_data() -> None:
    window = WindowSpec(warmup=2, min_batches=3, max_batches=3, seconds=0.0)
    result = measure_training(lambda: PlainLoop(TinyDataset(40), 4), window, step_s=0.001)
    assert (result.batches, result.samples, result.leaked_processes) == (3, 12, 0)
    assert 0 < result.waited_s < result.seconds  # three 1 ms steps are in the window too
    assert (result.copy_s, result.copied_bytes, result.copy_bytes_per_s) == (0.0, 0, None)
    assert result.step_ms is not None and result.step_ms >= 1.0


def test_a_step_holding_the_gil_spins_instead_of_sleeping() -> None:
    window = WindowSpec(warmup=1, min_batches=2, max_batches=2, seconds=0.0)
    loader = lambda: PlainLoop(TinyDataset(40), 4)  # noqa: E731
    iterations = calibrate_spin(0.02)  # a 20 ms step of Python
    spun = measure_training(loader, window, step_s=0.02, spin_iterations=iterations)
    slept = measure_training(loader, window, step_s=0.02)
    assert spun.step_ms is not None and slept.step_ms is not None and slept.step_ms >= 20
    # The window's CPU: two spun steps of about 20 ms each; asleep, next to none.
    assert spun.main_cpu_s - slept.main_cpu_s > 0.02


def test_the_copy_to_the_accelerator_moves_every_tensor_then_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    waits: list[bool] = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda: waits.append(True))
    batch = {"image": torch.zeros(4, 3, dtype=torch.uint8), "rest": [torch.ones(2), "name"]}
    assert Accelerator(torch.device("cpu")).copy(batch) == 12 + 8
    assert waits == [True]


def test_train_row_says_how_long_each_loader_kept_the_loop_waiting() -> None:
    pytest.importorskip("torch")
    options = BenchOptions(workloads=("train",), quick=True, repeat=1)
    row, threads = runner.run_benchmark(options, progress=None).rows
    assert threads.kind == "variant" and threads.config == "2 thread workers"
    assert [run.batches for run in threads.runs["conveyor"]] == [10]
    assert row.kind == "train" and row.errors == {}
    assert row.config.startswith("2 workers, persistent, 5 ms step, ")
    for loader in ("conveyor", "torch"):
        [run] = row.runs[loader]
        assert run.batches == 10 and 0 <= run.waited_share < 1 and run.leaked_processes == 0
    assert row.notes[0].startswith("waiting for data: conveyor ")
    assert ", torch " in row.notes[0]
    assert any(note.startswith("of ideal 12,800/s") for note in row.notes)


def test_reference_loop_delivers_every_batch_in_order_and_leaves_no_process() -> None:
    from tests.helpers.leaks import no_leaks

    from conveyor_bench.reference import SharedMemoryLoop
    from conveyor_bench.workloads import TinyDataset

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


def test_quick_runs_the_start_method_rows_under_fork_only() -> None:
    # A spawned torch worker imports torch (seconds); --quick is a smoke test.
    full, quick = BenchOptions(), BenchOptions(quick=True)
    assert row_methods(WORKLOADS["startup"], full) == ["spawn"]
    assert row_methods(WORKLOADS["startup"], quick) == ["fork"]
    assert row_methods(WORKLOADS["epochs"], full) == ["fork", "spawn"]
    assert row_methods(WORKLOADS["epochs"], quick) == ["fork"]
    asked = BenchOptions(quick=True, start_method="forkserver")
    assert row_methods(WORKLOADS["tiny"], asked) == ["forkserver"]
