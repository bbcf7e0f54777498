"""The benchmark's optional columns, SPDL's and Grain's loaders, on real workers: each
delivers every sample of the workload once, its processes and shared memory are gone
after it, and a quick run puts it on the workers row. Skipped where the package is not
installed; Grain spawns its workers, so its cases run with -m slow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conveyor_bench import BenchOptions, run_benchmark
from conveyor_bench.alternatives import LOADERS
from conveyor_bench.workloads import FreshImageDataset, TinyDataset
from tests.helpers.leaks import no_leaks

pytestmark = [pytest.mark.torch]

NAMES = ["spdl", pytest.param("grain", marks=pytest.mark.slow)]


def _require(name: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip({"spdl": "spdl.dataloader", "grain": "grain.python"}[name])


def _labels(batch: Any) -> list[int]:
    return np.asarray(batch[1]).tolist()


@pytest.mark.parametrize("name", NAMES)
def test_alternative_delivers_every_sample_once_and_leaves_nothing(name: str) -> None:
    _require(name)
    dataset = FreshImageDataset(6 * 4)
    labels = []
    with no_leaks():
        for batch in LOADERS[name](dataset, batch_size=4, num_workers=2):
            images = np.asarray(batch[0])
            assert images.shape == (4, 3, 224, 224) and images.dtype == np.uint8
            for image, label in zip(images, _labels(batch), strict=True):
                assert np.array_equal(image, dataset[label][0])
                labels.append(label)
            del batch, images, image  # a batch in shared memory is freed with its arrays
    assert sorted(labels) == list(range(24))  # in the order they finish, each once


@pytest.mark.parametrize("name", NAMES)
def test_quick_run_puts_the_alternative_on_the_workers_row(name: str) -> None:
    _require(name)
    options = BenchOptions(("tiny",), quick=True, repeat=1, loaders=("conveyor", name))
    rows = run_benchmark(options, progress=None).rows
    workers = rows[0]
    assert workers.config == "2 workers, persistent" and workers.errors == {}
    [run] = workers.runs[name]
    assert run.samples_per_s > 0 and run.leaked_processes == 0 and run.worker_processes == 2
    assert any(note.startswith(f"conveyor vs {name} ") for note in workers.notes)
    assert all(name not in row.runs for row in rows[1:])  # the workers row only
    assert isinstance(TinyDataset(1)[0][1], int)
