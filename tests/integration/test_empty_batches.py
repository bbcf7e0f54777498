"""Empty arrays and empty batches cross the transport, and ``conveyor doctor`` copes.

Zero-length NumPy arrays and torch tensors (with torch) as samples, batches of zero rows from a
``collate_fn``: under fork and spawn each batch must equal the one built without
workers (type, dtype, shape). ``conveyor doctor`` runs as the command it is (a
subprocess) on those datasets, and on the shared-file-handle dataset of
docs/troubleshooting.md with 2 workers, which once crashed it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader
from tests.integration import empty_datasets as ds

try:
    import torch
except ImportError:  # the NumPy cases run, the torch ones skip (marked)
    torch = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
METHODS = ["fork", pytest.param("spawn", marks=pytest.mark.slow)]
DOCTOR_TIMEOUT_S = 240
DOCTOR_OPTIONS = ("--workers", "0,2", "--start-method")


def _same(a: Any, b: Any, path: str = "batch") -> None:
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, np.ndarray) or (torch is not None and isinstance(a, torch.Tensor)):
        assert (a.dtype, tuple(a.shape)) == (b.dtype, tuple(b.shape)), path
        assert (a == b).all(), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("dataset", "collate_fn"),
    [
        pytest.param(ds.EmptyArrays(), None, id="numpy-zero-length"),
        pytest.param(ds.EmptyTensors(), None, id="torch-zero-length", marks=pytest.mark.torch),
        pytest.param(ds.EmptyArrays(), ds.zero_rows, id="zero-rows"),
    ],
)
def test_empty_arrays_and_batches_cross_the_transport(
    method: str, dataset: Any, collate_fn: Any
) -> None:
    kwargs: dict[str, Any] = {"batch_size": 16}
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    expected = list(DataLoader(dataset, num_workers=0, **kwargs))
    got = list(DataLoader(dataset, num_workers=2, multiprocessing_context=method, **kwargs))
    assert len(got) == len(expected) == ds.LENGTH // 16
    for batch, reference in zip(got, expected, strict=True):
        _same(batch, reference)
    first = got[0]
    if collate_fn is not None:  # zero rows, whatever the leaf
        assert [tuple(v.shape) for v in first.values()] == [(0,), (0, 4), (0, 4)]
    elif isinstance(first, dict):
        assert (tuple(first["vec"].shape), tuple(first["mat"].shape)) == ((16, 0), (16, 0, 3))
    else:
        assert [tuple(t.shape) for t in first] == [(16, 0), (16, 3, 0, 2), (16,)]


def _doctor(target: str, method: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``conveyor doctor`` as a user runs it (the console script calls cli.main)."""
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "doctor", target, *DOCTOR_OPTIONS, method],
        capture_output=True,
        text=True,
        timeout=DOCTOR_TIMEOUT_S,
        cwd=cwd,
    )


def _measured_rows(out: str) -> dict[int, tuple[str, int]]:
    """The report's table of runs: worker count -> (samples/s as printed, batches timed)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "samples/s" in line)
    rows = {}
    for line in lines[start + 1 :]:
        cells = [c for c in line.split() if c != "fastest"]
        if not cells or not cells[0].isdigit():
            break
        rows[int(cells[0])] = (cells[-2], int(cells[-1]))
    return rows


def _assert_measured(out: str) -> None:
    """Both worker counts ran batches and have a rate (not '-')."""
    rows = _measured_rows(out)
    assert sorted(rows) == [0, 2], out
    for rate, batches in rows.values():
        assert batches > 0 and rate.replace(",", "").isdigit(), out


RECORDS = """
class Records:
    def __init__(self, path):
        self.file = open(path, "rb")

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        self.file.seek(i * 8)
        return int.from_bytes(self.file.read(8), "little")


def train_set():
    return Records("records.bin")
"""


@pytest.mark.slow  # a `conveyor doctor` process importing torch (about 5 s)
@pytest.mark.parametrize("method", METHODS)
def test_doctor_on_a_dataset_holding_a_shared_file_handle(method: str, tmp_path: Path) -> None:
    (tmp_path / "records.py").write_text(RECORDS)
    (tmp_path / "records.bin").write_bytes(b"".join(i.to_bytes(8, "little") for i in range(1000)))

    done = _doctor("records:train_set", method, tmp_path)

    assert "Traceback" not in done.stderr, done.stderr
    fix = "Fix: store conveyor.per_worker(open, 'records.bin', 'rb') in dataset.file instead"
    assert fix in done.stdout, done.stdout
    if method == "fork":  # forked workers would share the handle's file offset: measured
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1. dataset.file  [shared-file-handle]" in done.stdout
        assert "0 errors, 1 warning: exit status 0" in done.stdout
        _assert_measured(done.stdout)
    else:  # the open file cannot be sent to a spawned worker: refused, and said so
        assert done.returncode == 1, done.stdout + done.stderr
        assert "1. dataset.file  [unpicklable]" in done.stdout
        assert "not started: the pre-flight found [unpicklable]" in done.stdout
        assert "1 error, 0 warnings: exit status 1" in done.stdout


@pytest.mark.slow  # a doctor run each (a child importing torch); the one above stays default
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("target", "arrays"),
    [
        # batch_size 32: the labels' int64 are the only array bytes (and the dict's keys
        # the only other data); zero rows: no array bytes at all
        ("arrays", "one batch         312 B (arrays 256 B, other data pickled 56 B)"),
        pytest.param(
            "tensors",
            "one batch         256 B (arrays 256 B, other data pickled 0 B)",
            marks=pytest.mark.torch,
        ),
        ("zero_row_loader", "(arrays 0 B, other data pickled"),
    ],
)
def test_doctor_on_empty_arrays_and_batches(method: str, target: str, arrays: str) -> None:
    done = _doctor(f"tests.integration.empty_datasets:{target}", method, ROOT)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert arrays in done.stdout, done.stdout
    assert "0 errors, 0 warnings: exit status 0" in done.stdout, done.stdout
    _assert_measured(done.stdout)
