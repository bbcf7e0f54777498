"""Loaders built where torch users build them: in a spawned process (classes from its
``__main__`` resolve in the workers), and over datasets holding multiprocessing locks
and shared values (pickled while each worker is spawned, as torch does)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from conveyor import DataLoader

SCRIPT = Path(__file__).with_name("scripts") / "spawned_parent.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "method",
    [pytest.param(m, marks=pytest.mark.slow) for m in ("fork", "forkserver", "spawn")],
)  # (all slow: a spawned parent process, then its workers, about 6 s each)
def test_a_spawned_parents_main_classes_reach_the_workers(method: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), method],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[[0, 1, 4, 9, 16], [25, 36, 49, 64, 81]]"


class Counted:
    """Counts its fetches in a shared Value under a shared Lock: it only works if both
    really are shared with every worker."""

    def __init__(self, context: Any) -> None:
        self.lock = context.Lock()
        self.count = context.Value("i", 0, lock=False)

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        with self.lock:
            self.count.value += 1
        return i


@pytest.mark.parametrize(
    "method", ["fork", "forkserver", pytest.param("spawn", marks=pytest.mark.slow)]
)
def test_multiprocessing_locks_and_values_are_shared_with_workers(method: str) -> None:
    dataset = Counted(multiprocessing.get_context(method))
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=method)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert dataset.count.value == 12  # every worker's fetches landed in the one value


def test_a_typed_named_tuple_defined_in_a_function_reaches_the_workers() -> None:
    # What the workers cannot import (a class of __main__, of a notebook, of a function)
    # travels by value; a typing.NamedTuple does only from cloudpickle 2.2.1 on (before,
    # the worker failed to start: KeyError: '__module__').
    class Point(NamedTuple):
        x: int
        y: int

    class Points:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> dict[str, int]:
            return Point(i, -i)._asdict()

    loader = DataLoader(Points(), batch_size=2, num_workers=1, multiprocessing_context="forkserver")
    assert [b["y"].tolist() for b in loader] == [[0, -1], [-2, -3]]
