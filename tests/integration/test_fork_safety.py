"""No thread of conveyor's outlives its need, so later forks copy a one-thread process.

Workers first started from a thread other than the main one are started from that
thread and need no thread of conveyor's to die with this process (see
``_workers/parent_watch.py``); the pin thread goes with its epoch. Python 3.12+ warns
at a fork in a process with other threads; that check runs in a clean process, where
nothing else (a test's own threads, the "error" filter, under which CPython drops this
warning) is in the way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conveyor import DataLoader

SCRIPT = Path(__file__).with_name("scripts") / "fork_after_threads.py"
ROOT = Path(__file__).resolve().parents[2]


def conveyor_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("conveyor-")]


def _in_a_thread(loader: DataLoader) -> list[list[int]]:
    got: list[list[int]] = []
    thread = threading.Thread(target=lambda: got.extend(b.tolist() for b in loader))
    thread.start()
    thread.join()
    return got


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_started_from_a_thread_leave_no_thread_behind(persistent: bool) -> None:
    loader = DataLoader(
        list(range(8)), batch_size=4, num_workers=2, persistent_workers=persistent,
        multiprocessing_context="fork",
    )  # fmt: skip
    assert _in_a_thread(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # The workers live on (persistent), yet no thread of conveyor's does: they die with
    # this process through their parent-watch pipes, whatever thread started them.
    assert conveyor_threads() == []
    if persistent:
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        del loader
    assert conveyor_threads() == []


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.12+ warns of such forks")
@pytest.mark.parametrize(
    "scenario",
    [
        "first_epoch_in_a_thread",
        "persistent_workers_started_in_a_thread",
        "persistent_loader_alive_after_a_thread_started_it",
        "pinned_epochs",
    ],
)
def test_later_forks_are_forks_of_a_single_threaded_process(scenario: str) -> None:
    assert _fork_warnings(scenario) == []


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.12+ warns of such forks")
def test_the_script_sees_the_warning_when_a_thread_runs() -> None:
    found = _fork_warnings("control")
    assert found and all("is multi-threaded, use of fork()" in text for text in found)


def _fork_warnings(scenario: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), scenario],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: list[str] = json.loads(done.stdout)
    return found
