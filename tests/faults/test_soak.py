"""Soak: a killer SIGKILLs random workers at random moments while epochs run.

Every epoch must still deliver each index exactly once (in order when asked), the
loader must never give up, and no good sample may be recorded as skipped. With
``on_error="skip"`` and a seeded random set of samples that always raise (of a few
exception types), exactly those are recorded, each with its own type. Kills come
every 0.05-0.4 s under fork and every 0.5-2.5 s under spawn and forkserver (whose
workers take longer to start).

The run is bounded by kills, not by a clock: epochs run until the killer has killed
``KILLS`` workers, however fast or slow the machine (the kills come on the killer's
clock, the epochs on the machine's; pytest's timeout guards a killer that never
kills). How many epochs that took is recorded (``record_property``), not asserted.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from conveyor import DataLoader, WorkerRestartedWarning

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    # 4 workers on a 2-core machine on purpose: kills must not leave a worker idle.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

LENGTH = 3000
KILL_EVERY = {"fork": (0.05, 0.4), "spawn": (0.5, 2.5), "forkserver": (0.5, 2.5)}
KILLS = {"fork": 20, "spawn": 5, "forkserver": 5}  # epochs run until this many kills
ERRORS = (ValueError, KeyError, OSError)


def bad_samples(seed: int, count: int = 14) -> dict[int, type[Exception]]:
    """A seeded random set of samples that raise every time, each with its own type."""
    rng = random.Random(seed)
    return {i: rng.choice(ERRORS) for i in sorted(rng.sample(range(LENGTH), count))}


class Registers:
    """``dataset[i] == i`` after ~0.2 ms of work; each worker writes its pid to a
    directory once, so the killer knows whom to kill."""

    def __init__(self, directory: str, bad: dict[int, type[Exception]] | None = None) -> None:
        self.directory = directory
        self.bad = bad or {}
        self._registered = 0

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> int:
        pid = os.getpid()
        if self._registered != pid:
            self._registered = pid
            Path(self.directory, str(pid)).touch()
        error = self.bad.get(index)
        if error is not None:
            raise error(f"sample {index} is corrupt")
        deadline = time.perf_counter() + 0.0002
        while time.perf_counter() < deadline:
            pass
        return index


@contextmanager
def killer(directory: Path, every: tuple[float, float], seed: int) -> Iterator[list[int]]:
    """Kill a random registered, still-running worker at random intervals."""
    rng = random.Random(seed)
    stop = threading.Event()
    killed: list[int] = []
    mine = os.getpid()

    def run() -> None:
        while not stop.wait(rng.uniform(*every)):
            pids = [int(p.name) for p in directory.iterdir()]
            rng.shuffle(pids)
            for pid in pids:
                try:
                    process = psutil.Process(pid)
                    if mine not in (p.pid for p in process.parents()):
                        continue  # long gone, the pid reused by someone else
                    process.send_signal(signal.SIGKILL)
                except psutil.Error:
                    continue
                killed.append(pid)
                break

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "any-order"])
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_every_epoch_is_exact_under_random_kills(
    method: str, in_order: bool, tmp_path: Path, record_property: Any
) -> None:
    loader = DataLoader(
        Registers(str(tmp_path)), batch_size=16, num_workers=4, in_order=in_order,
        persistent_workers=True, multiprocessing_context=method, max_worker_restarts=100_000,
        preflight=False,  # the killer is a thread of this process, on purpose
    )  # fmt: skip
    epochs = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        with killer(tmp_path, KILL_EVERY[method], seed=len(method) + in_order) as killed:
            while len(killed) < KILLS[method]:
                got = [int(i) for batch in loader for i in batch]
                if in_order:
                    assert got == list(range(LENGTH)), f"epoch {epochs}"
                else:
                    assert sorted(got) == list(range(LENGTH)), f"epoch {epochs}"
                epochs += 1
    stats = loader.statistics()
    record_property("epochs", epochs)
    record_property("kills", len(killed))
    assert stats is not None
    assert loader.skipped_samples == ()  # no good sample accused
    # Each kill seen is a restart; a kill during the last epoch's end may not be seen yet.
    assert 1 <= stats.worker_restarts <= len(killed)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_skips_are_exactly_the_bad_samples_under_random_kills(
    method: str, tmp_path: Path, record_property: Any
) -> None:
    bad = bad_samples(seed=len(method))
    loader = DataLoader(
        Registers(str(tmp_path), bad=bad), batch_size=16, num_workers=4,
        persistent_workers=True, multiprocessing_context=method, on_error="skip",
        max_errors=len(bad), max_worker_restarts=100_000, preflight=False,
    )  # fmt: skip
    expected = {i: f"builtins.{error.__name__}" for i, error in bad.items()}
    epoch = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        with killer(tmp_path, KILL_EVERY[method], seed=7 + len(method)) as killed:
            while len(killed) < KILLS[method]:
                got = [int(i) for batch in loader for i in batch]
                assert got == [i for i in range(LENGTH) if i not in bad], f"epoch {epoch}"
                records = [s for s in loader.skipped_samples if s.epoch == epoch]
                # Exactly the bad samples, each once, for what it raised: none for a kill.
                assert {s.index: s.exception_type for s in records} == expected, epoch
                assert len(records) == len(bad) and {s.stage for s in records} == {"fetch"}
                epoch += 1
    record_property("epochs", epoch)
    record_property("kills", len(killed))
    stats = loader.statistics()
    assert stats is not None and 1 <= stats.worker_restarts <= len(killed)
