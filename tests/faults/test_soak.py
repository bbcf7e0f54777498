"""Soak: a killer SIGKILLs random workers at random moments while epochs run.

Every epoch must still deliver each index exactly once (in order when asked), the
loader must never give up, and no good sample may be recorded as skipped. With
``on_error="skip"`` and some samples that always raise, exactly those are recorded.
Kills come every 0.05-0.4 s under fork and every 0.5-2.5 s under spawn and
forkserver (whose workers take longer to start).
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
BAD = frozenset(range(7, LENGTH, 211))  # raise ValueError every time they are fetched
KILL_EVERY = {"fork": (0.05, 0.4), "spawn": (0.5, 2.5), "forkserver": (0.5, 2.5)}
KILLS = {"fork": 20, "spawn": 5, "forkserver": 5}  # epochs run until this many kills
SOAK_LIMIT_S = 60.0


class Registers:
    """``dataset[i] == i`` after ~0.2 ms of work; each worker writes its pid to a
    directory once, so the killer knows whom to kill."""

    def __init__(self, directory: str, bad: frozenset[int] = frozenset()) -> None:
        self.directory = directory
        self.bad = bad
        self._registered = 0

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> int:
        pid = os.getpid()
        if self._registered != pid:
            self._registered = pid
            Path(self.directory, str(pid)).touch()
        if index in self.bad:
            raise ValueError(f"sample {index} is corrupt")
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
    method: str, in_order: bool, tmp_path: Path
) -> None:
    loader = DataLoader(
        Registers(str(tmp_path)), batch_size=16, num_workers=4, in_order=in_order,
        persistent_workers=True, multiprocessing_context=method, max_worker_restarts=100_000,
        preflight=False,  # the killer is a thread of this process, on purpose
    )  # fmt: skip
    deadline = time.monotonic() + SOAK_LIMIT_S
    epochs = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        with killer(tmp_path, KILL_EVERY[method], seed=len(method) + in_order) as killed:
            while len(killed) < KILLS[method] and time.monotonic() < deadline:
                got = [int(i) for batch in loader for i in batch]
                if in_order:
                    assert got == list(range(LENGTH)), f"epoch {epochs}"
                else:
                    assert sorted(got) == list(range(LENGTH)), f"epoch {epochs}"
                epochs += 1
    stats = loader.statistics()
    assert stats is not None
    assert len(killed) >= KILLS[method], f"only {len(killed)} kills in {epochs} epochs"
    assert stats.worker_restarts >= 1
    assert loader.skipped_samples == ()


def test_skips_are_exactly_the_bad_samples_under_random_kills(tmp_path: Path) -> None:
    loader = DataLoader(
        Registers(str(tmp_path), bad=BAD), batch_size=16, num_workers=4,
        persistent_workers=True, multiprocessing_context="fork", on_error="skip",
        max_errors=len(BAD), max_worker_restarts=100_000, preflight=False,
    )  # fmt: skip
    deadline = time.monotonic() + SOAK_LIMIT_S
    epoch = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartedWarning)
        with killer(tmp_path, KILL_EVERY["fork"], seed=7) as killed:
            while len(killed) < KILLS["fork"] and time.monotonic() < deadline:
                got = [int(i) for batch in loader for i in batch]
                assert got == [i for i in range(LENGTH) if i not in BAD]
                records = [s for s in loader.skipped_samples if s.epoch == epoch]
                assert sorted(s.index for s in records) == sorted(BAD)
                assert {s.stage for s in records} == {"fetch"}
                epoch += 1
    assert len(killed) >= KILLS["fork"]
