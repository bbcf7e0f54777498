"""Many workers under a real ``ulimit -n``: it works, or the pre-flight says so up front.

A child program sets its soft RLIMIT_NOFILE (``resource.setrlimit``) to the descriptors
it has open plus ``FDS_PER_WORKER`` for each of 32 workers (8 under spawn) plus some
room, then iterates a loader that keeps every batch (400: batches the loop keeps cost no
descriptor). With no room the running workers would not fit: the pre-flight refuses
at ``iter()``, before any worker starts. With less room than the pre-flight's margin
it warns at ``iter()`` and runs. With room, it runs silently. Never does it fail
mid-epoch. Each run also counts the descriptors the loader holds in the main process
once its workers run: exactly ``FDS_PER_WORKER`` per worker and ``FDS_PER_LOADER``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.diagnostics.environment import FD_MARGIN, FDS_PER_LOADER, FDS_PER_WORKER

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).parent / "scripts" / "open_file_limit.py"
WORKERS = 32
# Spawned workers each import torch afresh (about 2 s of CPU each: 32 of them cost CI a
# minute of its two cores); a worker's descriptors are the same whatever their number.
SPAWNED_WORKERS = 8
BATCHES = 400


@pytest.mark.parametrize(
    ("room", "outcome"),
    [
        (0, "refused"),  # the running workers alone need FDS_PER_LOADER more
        # they fit, but not with the margin (32 workers each: with -m slow)
        pytest.param(FD_MARGIN - 4, "warned", marks=pytest.mark.slow),
        pytest.param(FD_MARGIN + 32, "runs", marks=pytest.mark.slow),
    ],
)
def test_many_workers_under_a_real_open_file_limit(
    start_method: str, room: int, outcome: str
) -> None:
    workers = SPAWNED_WORKERS if start_method == "spawn" else WORKERS
    done = subprocess.run(
        [sys.executable, str(SCRIPT), start_method, str(workers), str(room)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])

    # Never mid-epoch: no error at all, or one from iter() before any batch.
    assert report["error"] is None or report["error"][0] == "iter", report
    if outcome == "refused":
        assert report["findings"] == [["open-file-limit", "ERROR"]], report
        assert report["error"][1] == "ConfigError", report
        assert f"is too low for {workers} workers" in report["error"][2], report
        assert (report["batches"], "held" in report) == (0, False), report  # none started
        return
    expected = [] if outcome == "runs" else [["open-file-limit", "WARNING"]]
    assert report["findings"] == expected, report
    assert (report["error"], report["batches"], report["distinct"]) == (None, BATCHES, BATCHES)
    assert report["held"] == FDS_PER_WORKER * workers + FDS_PER_LOADER, report
