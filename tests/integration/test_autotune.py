"""``num_workers="auto"`` with real workers: it adds workers while the loop waits on busy
ones, says what it chose and why, resumes exactly, and never goes past the memory
budget (in a real memory cgroup, where the machine allows one)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import ConfigError, DataLoader
from tests.helpers.cgroup import memory_cgroup
from tests.helpers.leaks import no_leaks


class Waits:
    """Each sample waits 4 ms (storage stands in): more workers, more samples a second."""

    def __init__(self, n: int = 1200) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        threading.Event().wait(0.004)
        return np.full(2, i)


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_auto_adds_workers_while_the_loop_waits_for_busy_ones(
    method: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="conveyor"), no_leaks():
        loader = DataLoader(Waits(), batch_size=8, num_workers="auto", worker_method=method)
        started = loader.num_workers
        seen = [int(i) for batch in loader for i in batch[:, 0]]
        stats = loader.statistics()
        del loader
    assert seen == list(range(1200))  # the order never depends on the count
    assert stats is not None and len(stats.workers) > started
    assert stats.notes[0].startswith(f"{started} workers: {started} workers to start")
    assert any("added" in note for note in stats.notes[1:])
    said = [m for m in caplog.messages if m.startswith("num_workers='auto'")]
    assert said[0].endswith(
        "(affinity and cgroup quota)" + (", two threads each" if method == "thread" else "")
    )


def test_a_resume_under_auto_is_exact() -> None:
    def make() -> DataLoader:
        import torch

        g = torch.Generator().manual_seed(5)
        return DataLoader(
            Waits(240), batch_size=8, shuffle=True, generator=g, num_workers="auto",
            worker_method="thread", reseed="batch",
        )  # fmt: skip

    pytest.importorskip("torch", reason="the shuffle's generator is torch's")
    whole = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    first = [next(it).tolist() for _ in range(17)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    assert first + [b.tolist() for b in resumed] == whole


def test_auto_is_a_word_not_any_string() -> None:
    with pytest.raises(ConfigError, match="num_workers must be an int >= 0 or 'auto'"):
        DataLoader(Waits(), num_workers="many")


MEMORY_SCRIPT = Path(__file__).parent / "scripts" / "auto_under_a_limit.py"
LIMIT = 1 << 30  # 1 GiB: the main process and a few 200 MiB workers


@pytest.mark.slow
def test_auto_never_goes_past_the_memory_budget(record_property: Any) -> None:
    with memory_cgroup(LIMIT) as (group, why):
        if group is None:
            pytest.skip(f"no memory cgroup can be made here: {why}")
        argv = [sys.executable, str(MEMORY_SCRIPT)]
        done = subprocess.run(group.command(argv), capture_output=True, text=True, timeout=280)
        kills = group.oom_kills()
    assert kills in (0, None), f"the OOM killer struck: {done.stderr[-2000:]}"
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    record_property("notes", report["notes"])
    assert report["seen"] == report["expected"]
    # It wanted more (the loop kept waiting on busy workers) and memory said no.
    assert any("would not fit the memory left" in note for note in report["notes"]), report


@pytest.mark.slow  # waits for the tuner to settle (about 6 s)
def test_auto_retires_workers_the_loop_does_not_wait_for_and_settles() -> None:
    """A slow training step: workers idle most of the time, one goes each window, down to
    one; then nothing changes, and after a few windows the count is said to be settled."""
    with no_leaks():
        loader = DataLoader(
            np.arange(80_000.0), batch_size=8, num_workers="auto", worker_method="thread"
        )
        started = loader.num_workers
        seen: list[float] = []
        for batch in loader:
            seen += batch.tolist()
            threading.Event().wait(0.01)  # the training step
            stats = loader.statistics() if len(seen) % 64 == 0 else None
            if stats is not None and stats.settled_after_s is not None:
                break
        del loader
    assert seen == list(range(len(seen)))
    assert stats is not None and any("retired a worker" in note for note in stats.notes)
    assert stats.settled_after_s is not None, stats.notes  # well before the 10,000 batches
    # Down to one where the loop keeps up; on a loaded machine it may keep two.
    count = stats.auto_workers
    assert count is not None and count < started
    workers = f"{count} worker" + ("" if count == 1 else "s")
    assert stats.notes[-1].startswith(f"settled at {workers} after ")
    assert stats.as_dict()["auto_settled_after_s"] == stats.settled_after_s
