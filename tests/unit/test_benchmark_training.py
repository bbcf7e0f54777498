"""The benchmark's training-like workloads (fresh, decode, text, big), what each row measures
beyond samples/s (workers' CPU and page faults, the loader's own CPU, the machine check),
the targets printed beside the figures, and the optional SPDL and Grain columns.

Timings are never asserted; only that the runs happen and the figures are put together
as documented (benchmarks/README.md).
"""

from __future__ import annotations

import multiprocessing
import random
import sys
import time

import numpy as np
import pytest

from conveyor.cli import main
from conveyor_bench import BenchOptions, Measurement, Row, render, runner, workload
from conveyor_bench.catalogue import WORKLOADS
from conveyor_bench.machine import machine_check
from conveyor_bench.measure import PlainLoop
from conveyor_bench.notes import against, annotate
from conveyor_bench.processes import TreeUsage
from conveyor_bench.report import to_json
from conveyor_bench.rows import NOT_INSTALLED
from conveyor_bench.runner import BenchReport
from conveyor_bench.workloads import (
    BIG_MIB,
    BigDataset,
    FreshImageDataset,
    TextDataset,
    pad_collate,
)

# --- the workloads' samples ------------------------------------------------------------------


def test_fresh_sample_is_a_new_array_each_time() -> None:
    ds = FreshImageDataset(40)
    first, again = ds[17][0], ds[17][0]
    assert first.shape == (3, 224, 224) and first.dtype == np.uint8
    assert first is not again and not np.shares_memory(first, again)
    assert np.array_equal(first, again) and np.array_equal(first, ds[1][0])  # pool of 16


def test_text_samples_are_fresh_token_arrays_of_16_to_512() -> None:
    ds = TextDataset(200, pool=4096)
    lengths = [len(ds[i]) for i in range(200)]
    assert min(lengths) >= 16 and max(lengths) <= 512 and len(set(lengths)) > 50
    assert ds[3].dtype == np.int64 and ds[3] is not ds[3]
    with pytest.raises(IndexError):
        ds[200]


def test_pad_collate_pads_to_the_longest_and_masks_the_padding() -> None:
    samples = [np.arange(1, 4), np.arange(1, 6)]
    batch = pad_collate(samples)
    assert list(batch) == ["input_ids", "attention_mask"]
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == np.int64


def test_big_batches_are_64_to_160_mib_and_differ() -> None:
    ds = BigDataset(16 * 100, batch_size=16)
    sizes = [ds.batch_mib(batch) for batch in range(100)]
    assert min(sizes) >= BIG_MIB[0] and max(sizes) <= BIG_MIB[1] and len(set(sizes)) > 50
    small = BigDataset(8, batch_size=4, mib=(1, 3))
    value, label = small[5]  # batch 1: 1 + 37 % 3 = 2 MiB over 4 samples
    assert value.dtype == np.float32 and value.nbytes == 2 * 2**20 // 4 and label == 5


def test_decode_crops_like_torchvision_reproducibly() -> None:
    imaging = pytest.importorskip("conveyor_bench.imaging")
    from conveyor_bench.workloads import DecodeDataset

    jpegs = imaging.make_jpegs(3, (120, 90))
    assert len(set(jpegs)) == 3 and all(j.startswith(b"\xff\xd8") for j in jpegs)
    assert imaging.make_jpegs(3, (120, 90)) is jpegs  # made once per process
    ds = DecodeDataset(6, jpegs)
    random.seed(7)
    value, label = ds[4]
    random.seed(7)
    assert np.array_equal(ds[4][0], value) and label == 4
    assert value.shape == (3, 224, 224) and value.dtype == np.uint8 and value.flags.writeable
    random.seed(3)
    for _ in range(200):  # torchvision's bounds: inside the image, within the ratios
        left, top, right, bottom = imaging.crop_box(500, 375)
        assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375


def test_decode_without_pillow_fails_its_row_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import conveyor_bench

    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL fails
    monkeypatch.delitem(sys.modules, "conveyor_bench.imaging", raising=False)
    monkeypatch.delattr(conveyor_bench, "imaging", raising=False)
    options = BenchOptions(workloads=("decode",), quick=True)
    [row] = runner.run_benchmark(options, progress=None).rows  # returns: the run goes on
    assert row.workload == "decode" and not row.runs
    assert "pip install pillow" in row.errors["conveyor"]
    assert "pip install pillow" in render(BenchReport({}, options, [row]))


def test_plain_loop_uses_the_workloads_collate_and_its_batch_range() -> None:
    loop = PlainLoop(TextDataset(40, pool=4096), 4, pad_collate, first=2, batches=3)
    batches = list(loop)
    assert len(batches) == 3 and set(batches[0]) == {"input_ids", "attention_mask"}


# --- what a run measures ---------------------------------------------------------------------


def _burn(megabytes: int, seconds: float) -> None:
    np.ones(megabytes * 2**20, np.uint8)  # fresh pages: minor faults
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_tree_usage_sees_a_childs_cpu_and_page_faults() -> None:
    before = TreeUsage.read()
    child = multiprocessing.get_context("fork").Process(target=_burn, args=(32, 0.3))
    child.start()
    while child.is_alive():  # read it while it lives: a process that ended is not seen
        now = TreeUsage.read()
        time.sleep(0.02)
    child.join()
    cpu, faults = now.since(before)
    assert child.pid in now.usage and cpu > 0
    assert faults is not None and faults > 0  # fewer than pages: huge pages count once


def test_machine_check_runs_the_loop_alone_and_side_by_side() -> None:
    dataset = FreshImageDataset(64)
    check = machine_check(lambda n: PlainLoop(dataset, 4, batches=n), 2, 0.01, 8, pairs=1)
    assert check.processes == 2 and 1 <= check.batches <= 8 and check.speedup > 0
    assert check.single_cpu_ms_per_batch >= 0 and check.parallel_cpu_ms_per_batch >= 0


# --- notes and targets -----------------------------------------------------------------------


def test_a_missed_target_says_so_plainly() -> None:
    assert against(0.95, 0.9, lambda v: f"{v:.0%}") == "95% (target >= 90%)"
    assert against(0.84, 0.9, lambda v: f"{v:.0%}") == "84% (below target >= 90%)"
    assert against(1.5, 1.7, lambda v: f"{v:.2f}x") == "1.50x (below target >= 1.70x)"
    assert against(2.0, 1.0, lambda v: f"{v:.2f}x") == "2.00x (target >= 1x)"
    assert against(0.5, None, lambda v: f"{v:.2f}x") == "0.50x"


def _run(samples_per_s: float, main_cpu_s: float = 0.0, workers_cpu_s: float = 0.0) -> Measurement:
    """A made-up run of 10 batches of 100 samples."""
    return Measurement(
        10,
        1000,
        1000 / samples_per_s,
        main_cpu_s,
        2**20,
        0,
        workers_cpu_s=workers_cpu_s,
        worker_processes=2 if workers_cpu_s else 0,
    )


def _decode_rows() -> list[Row]:
    from conveyor_bench.machine import MachineCheck

    plain = Row("decode", "single process, plain loop", "baseline", {"plain": [_run(100, 1.0)]})
    plain.machine = MachineCheck(2, 1.2, 100.0, 150.0, 5)
    return [
        Row(
            "decode",
            "2 workers, persistent",
            "throughput",
            {
                "conveyor": [_run(110, 0.05, 1.6)],
                "torch": [_run(120, 0.1, 1.6)],
                "grain": [_run(55, 0.1, 1.5)],
            },
            missing={"spdl": NOT_INSTALLED},
        ),
        Row("decode", "num_workers=0", "throughput", {"conveyor": [_run(100, 1.1)]}),
        plain,
        Row("decode", "reference loop", "reference", {"reference": [_run(125, 0.02, 1.55)]}),
    ]


def test_workers_row_notes_put_each_figure_beside_its_target() -> None:
    rows = _decode_rows()
    annotate(WORKLOADS["decode"], rows)
    notes = "; ".join(rows[0].notes)
    assert "of reference loop: conveyor 88% (below target >= 90%), torch 96%, grain 44%" in notes
    assert "vs torch: 0.92x (below target >= 1x)" in notes
    assert "vs its num_workers=0: conveyor 1.10x (target >= 1x)" in notes
    assert "vs single process: conveyor 1.10x (below target >= 1.20x), torch 1.20x" in notes
    assert "conveyor vs grain 2.00x" in notes and "spdl" not in notes  # its cell says why
    assert "machine check: 2 bare processes of this work ran 1.20x one" in rows[2].notes[1]


def test_loader_cpu_is_all_cpu_less_the_same_work_without_a_loader() -> None:
    rows = _decode_rows()
    annotate(WORKLOADS["decode"], rows)
    # Workers rows: (main + workers) / batch less the machine check's side-by-side 150 ms.
    assert rows[0].loader_cpu_ms["conveyor"] == pytest.approx(165 - 150)
    assert rows[3].loader_cpu_ms["reference"] == pytest.approx(157 - 150)
    # num_workers=0: the main process alone less the plain loop's 100 ms.
    assert rows[1].loader_cpu_ms["conveyor"] == pytest.approx(110 - 100)


def test_report_shows_alternatives_workers_and_loader_cpu() -> None:
    rows = _decode_rows()
    annotate(WORKLOADS["decode"], rows)
    report = BenchReport({"cores": "2"}, BenchOptions(repeat=1), rows)
    text = render(report)
    header = "| workload | config | conveyor samples/s | torch samples/s | spdl samples/s |"
    assert header + " grain samples/s | ratio | notes |" in text
    assert "| decode | 2 workers, persistent | 110 | 120 | not installed | 55 | 0.92x |" in text
    assert "| decode | 2 workers, persistent | conveyor | 110 | 110 - 110 | 5.00 | 160.00 |" in text
    assert "- decode: 2 bare processes ran 1.20x one" in text
    saved = to_json(report)["rows"][0]
    assert saved["missing"] == {"spdl": NOT_INSTALLED}
    assert saved["conveyor_vs"]["grain"] == pytest.approx(2.0)
    conveyor = saved["results"]["conveyor"]
    assert conveyor["loader_cpu_ms_per_batch"] == pytest.approx(15)
    assert conveyor["runs"][0]["workers_cpu_ms_per_batch"] == pytest.approx(160)


# --- options and the optional columns --------------------------------------------------------


def test_quick_leaves_out_the_alternatives_unless_asked() -> None:
    assert BenchOptions(quick=True).chosen_loaders == ("conveyor", "torch")
    assert BenchOptions().chosen_loaders == ("conveyor", "torch", "spdl", "grain")
    asked = BenchOptions(quick=True, loaders=("grain", "conveyor"))
    assert asked.chosen_loaders == ("conveyor", "grain")  # in the columns' order
    with pytest.raises(ValueError, match="choose from conveyor, torch, spdl, grain"):
        BenchOptions(loaders=("dali",))


def test_cli_rejects_an_unknown_loader(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--loaders", "conveyor,dali"])
    assert "unknown loader(s) dali" in capsys.readouterr().err


def test_an_alternative_not_installed_says_so_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner.alternatives, "describe", lambda name: NOT_INSTALLED)
    options = BenchOptions(workloads=("tiny",), quick=True, loaders=("conveyor", "spdl"))
    monkeypatch.setattr(workload, "_machine_check", lambda *args: None)
    monkeypatch.setattr(workload, "measure_throughput", lambda factory, window: _run(100))
    report = runner.run_benchmark(options, progress=None)
    workers = report.rows[0]
    assert workers.missing == {"spdl": NOT_INSTALLED} and "conveyor" in workers.runs
    assert report.environment["spdl column"] == NOT_INSTALLED
    assert "| not installed |" in render(report)
