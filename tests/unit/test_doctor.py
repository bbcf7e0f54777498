"""``conveyor doctor``: end to end in a subprocess, and its parts in-process.

Timings are never asserted, only that they are there; sizes are, where the dataset
fixes them.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor import Finding, Report, Severity
from conveyor.doctor import (
    LoaderRun,
    Profile,
    Target,
    UsageError,
    advise,
    batch_nbytes,
    fmt_bytes,
    fmt_seconds,
    load_target,
    render,
)
from conveyor.doctor.advice import method_advice
from conveyor.doctor.measure import probe_threads
from conveyor.doctor.profile import ThreadProbe

GOOD = """
import numpy as np


class Vectors:
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return np.full(1000, i, dtype=np.float32), i  # 4,000 + 8 bytes once collated


dataset = Vectors()
"""

SQLITE = """
import sqlite3


class Store:
    def __init__(self, path):
        self.connection = sqlite3.connect(path)


class Rows:
    def __init__(self):
        self.db = Store("rows.db")

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return i
"""


def doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "doctor", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))


# --- end to end ------------------------------------------------------------------------


def test_a_good_dataset_gets_every_section_and_exit_0(tmp_path: Path) -> None:
    write(tmp_path, "vectors", GOOD)
    done = doctor(tmp_path, "vectors:dataset", "--workers", "0,1", "--batches", "3")
    out = done.stdout
    assert done.returncode == 0, done.stderr + out
    assert out.startswith("conveyor doctor vectors:dataset\n")
    assert "vectors.Vectors (map-style, 256 samples)" in out
    assert "batch_size=32, collate_fn=default_collate" in out
    assert "Pre-flight checks\n  conveyor check of vectors.Vectors" in out
    assert "no problems found" in out
    assert "per-sample fetch  median " in out and "(50 samples, in-process)" in out
    # 32 samples x (4,000 bytes of float32 + one int64 label), all arrays.
    assert "one batch         128.3 kB (arrays 128.3 kB, other data pickled 0 B)" in out
    table = out[out.index("  workers  first batch") :].splitlines()
    assert table[0].split() == ["workers", "first", "batch", "samples/s", "batches"]
    for row, workers in zip(table[1:3], ("0", "1"), strict=True):
        cells = row.split()
        assert cells[0] == workers and cells[2] in ("µs", "ms", "s"), row
        assert float(cells[3].replace(",", "")) > 0 and cells[4] == "3", row
    assert "What to change\n  - " in out
    assert out.rstrip().endswith("0 errors, 0 warnings: exit status 0")
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.slow  # a `conveyor doctor` process importing torch (3-5 s)
def test_sqlite_under_spawn_exits_1_naming_the_attribute(tmp_path: Path) -> None:
    write(tmp_path, "rows", SQLITE)
    done = doctor(tmp_path, "rows.py:Rows", "--start-method", "spawn", "--workers", "0,1")
    out = done.stdout
    assert done.returncode == 1, done.stderr + out
    assert "1. dataset.db.connection  [unpicklable]" in out
    assert "sqlite3.Connection, which cannot be pickled" in out
    assert "not started: the pre-flight found [unpicklable]" in out
    assert "- [unpicklable] dataset.db.connection: store conveyor.per_worker(" in out
    assert out.rstrip().endswith("1 error, 0 warnings: exit status 1")


@pytest.mark.slow  # a `conveyor doctor` process importing torch (3-5 s)
def test_a_bad_target_exits_2_saying_what_failed(tmp_path: Path) -> None:
    done = doctor(tmp_path, "no_such_module:dataset")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("conveyor doctor: cannot import 'no_such_module': ")
    assert f"(looked in {tmp_path})" in done.stderr


@pytest.mark.slow  # a `conveyor doctor` process importing torch (3-5 s)
def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    done = doctor(tmp_path, "x:y", "--workers", "two")
    assert done.returncode == 2
    assert "--workers: 'two': expected counts >= 0" in done.stderr


# --- what MODULE:OBJECT names (in-process) --------------------------------------------


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tmp_path as the current directory; modules imported from it are forgotten after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_a_function_is_called_and_a_loader_gives_its_settings(here: Path) -> None:
    write(here, "made", GOOD + "\ndef make():\n    return dataset\n")
    made = load_target("made:make")
    assert type(made.dataset).__name__ == "Vectors" and made.batch_size == 32
    loader_module = here / "with_loader.py"
    loader_module.write_text(
        "from conveyor import DataLoader\nfrom made import dataset\n"
        "loader = DataLoader(dataset, batch_size=4, num_workers=2, prefetch_factor=5,"
        " multiprocessing_context='spawn')\n"
    )
    target = load_target(f"{loader_module}:loader")
    assert (target.batch_size, target.num_workers, target.prefetch_factor) == (4, 2, 5)
    assert target.start_method == "spawn"
    assert type(target.dataset).__name__ == "Vectors"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("made", "'made' is not MODULE:OBJECT"),
        ("made:missing", "module 'made' ("),
        ("made:np", "made:np is a builtins.module, not a dataset"),
        ("made:make_nothing", "made:make_nothing() returned a builtins.NoneType, not a dataset"),
        ("made:make_broken", "calling made:make_broken() failed: ZeroDivisionError"),
        ("broken:x", "cannot import 'broken': ValueError: no data here"),
        ("missing/dir.py:x", "there is no file"),
    ],
)
def test_usage_errors_name_what_failed(here: Path, spec: str, message: str) -> None:
    write(here, "made", GOOD + "\ndef make_nothing():\n    pass\n\ndef make_broken():\n    1 / 0\n")
    write(here, "broken", "raise ValueError('no data here')\n")
    with pytest.raises(UsageError) as caught:
        load_target(spec)
    assert message in str(caught.value)
    if spec == "broken:x":  # the user's frame, not ours or importlib's
        assert 'broken.py", line 1, in <module>' in str(caught.value)
        assert "doctor.py" not in str(caught.value)


def test_usage_error_is_a_config_error_from_errors_py() -> None:
    from conveyor.errors import ConfigError
    from conveyor.errors import UsageError as Defined

    assert UsageError is Defined and issubclass(UsageError, ConfigError)


# --- advice from numbers ---------------------------------------------------------------


def profile(**numbers: object) -> Profile:
    values: dict[str, object] = {"batch_size": 32, "cpus": 8, "start_method": "fork"}
    values.update(numbers)
    return Profile(**values)  # type: ignore[arg-type]


def test_cheap_samples_mean_few_workers() -> None:
    (advice,) = advise(profile(fetch_median_s=10e-6, fetch_p95_s=20e-6))
    assert advice.startswith("Samples are cheap (median 10.0 µs)")
    assert "Keep num_workers low, or 0." in advice


def test_slow_samples_mean_more_workers_up_to_the_cpus() -> None:
    (advice,) = advise(profile(fetch_median_s=0.020, fetch_p95_s=0.030))
    assert advice.startswith("Samples are slow (median 20.0 ms, about 50 samples/s")
    assert "up to the 8 CPUs this process may use (num_workers=8)" in advice


def test_samples_in_between_get_no_worker_advice() -> None:
    assert advise(profile(fetch_median_s=1e-3, fetch_p95_s=2e-3)) == []


def test_a_few_slow_samples_are_pointed_out() -> None:
    (advice,) = advise(profile(fetch_median_s=1e-3, fetch_p95_s=50e-3))
    assert "p95 50.0 ms, median 1.0 ms" in advice and "prefetch_factor" in advice


def test_large_batches_mean_smaller_batches_or_less_prefetch() -> None:
    runs = (LoaderRun(0, batch_bytes=(80_000_000, 0)), LoaderRun(4))
    (advice,) = advise(profile(runs=runs))
    assert advice.startswith("Batches are large (80.0 MB): with num_workers=4 and")
    assert "prefetch_factor=2, 8 batches (640.0 MB) can be in flight" in advice
    assert advice.endswith("Lower batch_size or prefetch_factor.")
    assert advise(profile(runs=(LoaderRun(0, batch_bytes=(40_000_000, 0)),))) == []


def test_slow_worker_start_means_persistent_workers() -> None:
    runs = (LoaderRun(0, first_batch_s=0.01), LoaderRun(2, first_batch_s=3.5))
    (advice,) = advise(profile(runs=runs, start_method="spawn"))
    assert "Workers take 3.50 s to deliver the first batch (num_workers=2, start method spawn)" in (
        advice
    )
    assert "persistent_workers=True" in advice


def test_the_fastest_run_is_named_when_two_were_measured() -> None:
    runs = (LoaderRun(0, 0.01, 1000.0, 5), LoaderRun(2, 0.2, 3500.0, 5))
    assert advise(profile(runs=runs)) == ["Fastest measured: num_workers=2 (3,500 samples/s)."]
    assert advise(profile(runs=runs[:1])) == []


def test_findings_come_first_with_their_fix_then_failures() -> None:
    finding = Finding("shared-file-handle", Severity.WARNING, "dataset.file", "w", "y", "do X.")
    runs = (LoaderRun(0, 0.01, 1000.0, 5), LoaderRun(2, error="KeyError: 'label'"))
    advice = advise(profile(runs=runs, fetch_median_s=1e-6, fetch_p95_s=1e-6), [finding])
    assert advice[0] == "[shared-file-handle] dataset.file: do X."
    assert advice[1].startswith("Loading failed (num_workers=2; the error is above).")
    assert advice[2].startswith("Samples are cheap")


# --- the report's parts -----------------------------------------------------------------


def test_batch_bytes_count_arrays_and_tensors_and_pickle_the_rest() -> None:
    torch = pytest.importorskip("torch")
    batch = {"x": np.zeros((4, 10), np.float64), "y": torch.zeros(4, dtype=torch.int32)}
    arrays, other = batch_nbytes({**batch, "names": ["a", "b"]})
    assert arrays == 4 * 10 * 8 + 4 * 4
    pickled = [len(pickle.dumps(s, protocol=5)) for s in ("x", "y", "names", "a", "b")]
    assert other == sum(pickled)  # the keys and the strings, each pickled


def test_units() -> None:
    assert [fmt_seconds(s) for s in (12e-6, 0.0123, 2.5)] == ["12.0 µs", "12.3 ms", "2.50 s"]
    assert [fmt_bytes(n) for n in (512, 128_256, 80e6, 3e12)] == [
        "512 B",
        "128.3 kB",
        "80.0 MB",
        "3000.0 GB",
    ]


def test_the_report_fits_100_columns_with_long_findings() -> None:
    long = "word " * 60
    finding = Finding("unpicklable", Severity.ERROR, "dataset." + "x" * 30, long, long, long)
    runs = (LoaderRun(0, 0.01, 1000.0, 5), LoaderRun(2, error="RuntimeError: " + long))
    numbers = profile(runs=runs, fetch_median_s=1e-3, fetch_p95_s=1e-3, problems=(long,))
    report = Report((finding,), subject="x")
    text = render(Target([1, 2, 3], "m:x"), numbers, report, advise(numbers, [finding]))
    assert max(len(line) for line in text.splitlines()) <= 100
    assert text.endswith("3 errors, 0 warnings: exit status 1")  # finding, problem, run


# --- processes or threads -----------------------------------------------------------------


def test_samples_that_mostly_wait_mean_many_threads() -> None:
    text = method_advice(ThreadProbe(8, 190.0, 1480.0, cpu_share=0.02), cpus=2)
    assert text.startswith("Samples mostly wait")
    assert "computing 2% of the time" in text and "(7.8x)" in text
    assert "worker_method='thread'" in text
    assert "num_workers=2 processes of threads_per_worker=16 threads each" in text


def test_samples_that_release_the_gil_mean_threads_as_many_as_cpus() -> None:
    text = method_advice(ThreadProbe(8, 100.0, 190.0, cpu_share=0.98), cpus=2)
    assert text.startswith("Samples release the GIL") and "num_workers=2" in text


def test_threads_are_advised_with_what_they_must_not_share() -> None:
    hazards = ("dataset.fh (thread-shared-file)", "dataset.db (thread-sqlite)")
    text = method_advice(ThreadProbe(8, 190.0, 1480.0, cpu_share=0.02), 2, hazards)
    assert "First fix what the threads would share: dataset.fh (thread-shared-file), " in text
    assert "worker_method='thread')" in text
    held = method_advice(ThreadProbe(8, 100.0, 104.0, cpu_share=0.99), 2, hazards)
    assert "First fix" not in held  # processes advised: the threads' hazards do not matter


def test_samples_that_hold_the_gil_mean_processes() -> None:
    text = method_advice(ThreadProbe(8, 100.0, 104.0, cpu_share=0.99), cpus=2)
    assert text.startswith("Samples hold the GIL")
    assert "worker_method='multiprocessing'" in text


class Waits:
    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> int:
        threading.Event().wait(0.005)  # an I/O stand-in: the thread blocks
        return i


def test_the_thread_probe_measures_a_waiting_dataset_as_waiting() -> None:
    probe = probe_threads(Waits(), threads=4, budget_s=0.2)
    assert probe is not None and probe.threads == 4
    assert probe.one_thread_per_s > 0 and probe.many_threads_per_s > 0
    assert probe.cpu_share < 0.5  # blocked, not computing, whatever the machine's load


def test_the_thread_probe_skips_iterable_and_failing_datasets() -> None:
    class Stream(conveyor.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(3))

    class Fails:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> int:
            raise KeyError(i)

    assert probe_threads(Stream()) is None
    assert probe_threads(Fails(), budget_s=0.05) is None
