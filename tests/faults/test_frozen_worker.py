"""A worker frozen between tasks (SIGSTOP, a debugger, a read stuck before the task
starts): ``timeout`` means torch's "no batch for N seconds", and a stall warning
names the task the worker has not started."""

from __future__ import annotations

import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import DataLoader, WorkerStallWarning, WorkerTimeoutError
from tests.faults import CHEAP_METHODS

pytestmark = pytest.mark.timeout(60)


class PostsPid:
    """dataset[i] == i; fetching index 1 writes the worker's pid to ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if index == 1:
            Path(self.marker).write_text(str(os.getpid()))
        return index


class FreezesWorkerOne:
    """Yields [0], [1], [2], [3]; before [3] (which goes to worker 1), stops worker 1.

    With prefetch_factor=1 and 2 workers, [3] is drawn when batch 1 is handed out,
    so worker 1 has answered its task and is idle: frozen before it starts the next.
    """

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.pid = 0

    def __len__(self) -> int:
        return 4

    def __iter__(self) -> Iterator[list[int]]:
        yield [0]
        yield [1]
        yield [2]
        self.pid = int(Path(self.marker).read_text())
        os.kill(self.pid, signal.SIGSTOP)
        yield [3]


def _loader(method: str, sampler: FreezesWorkerOne, **kwargs: Any) -> DataLoader:
    return DataLoader(
        PostsPid(sampler.marker),
        batch_sampler=sampler,
        num_workers=2,
        prefetch_factor=1,
        run_ahead=False,  # torch's dispatch, exactly: [3] is drawn as batch 1 is handed out
        multiprocessing_context=method,
        **kwargs,
    )


@pytest.mark.parametrize("method", CHEAP_METHODS)
def test_timeout_fires_for_a_worker_frozen_before_its_task(method: str, tmp_path: Path) -> None:
    sampler = FreezesWorkerOne(str(tmp_path / "pid"))
    it = iter(_loader(method, sampler, timeout=1))
    assert [next(it).item() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(WorkerTimeoutError) as info:
        next(it)
    message = str(info.value)
    assert isinstance(info.value, TimeoutError)
    assert "DataLoader timed out after 1 seconds" in message  # torch's words
    assert f"worker 1 (pid {sampler.pid}) has batch 3 (dataset indices [3])" in message
    assert "has not started it" in message
    assert "the process is stopped, by SIGSTOP or a debugger" in message
    assert info.value.indices == (3,)  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", CHEAP_METHODS)
def test_stall_warning_names_a_task_a_frozen_worker_has_not_started(
    method: str, tmp_path: Path
) -> None:
    sampler = FreezesWorkerOne(str(tmp_path / "pid"))
    it = iter(_loader(method, sampler, stall_warning=0.5))
    assert [next(it).item() for _ in range(3)] == [0, 1, 2]
    seen: list[str] = []

    def thaw(message: Any, *args: Any, **kwargs: Any) -> None:
        # Called in the loop's thread as the warning is issued: let the worker go on.
        seen.append(str(message))
        os.kill(sampler.pid, signal.SIGCONT)

    with warnings.catch_warnings():
        warnings.simplefilter("always", WorkerStallWarning)
        warnings.showwarning = thaw
        assert next(it).item() == 3
    assert len(seen) == 1
    assert f"worker 1 (pid {sampler.pid}) has batch 3 (dataset indices [3])" in seen[0]
    assert "it has not started it" in seen[0]
    assert list(it) == []
