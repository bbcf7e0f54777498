"""The torchvision workloads of the benchmark (issue 33): skipped with a note where
torchvision is missing; where it is installed, the samples ImageFolder and its v2
transforms give. Their settings are checked with the others' in test_benchmark.py."""

from __future__ import annotations

import sys

import pytest

from conveyor_bench import WORKLOADS, BenchOptions, run_benchmark


def test_the_torchvision_workloads_without_torchvision_say_so_on_their_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision fails
    options = BenchOptions(workloads=("torchvision", "torchvision-io"), quick=True, repeat=1)
    report = run_benchmark(options, progress=None)
    assert [row.workload for row in report.rows] == ["torchvision", "torchvision-io"]
    for row in report.rows:
        assert not row.runs and not row.errors
        (note,) = row.notes
        assert note.startswith("skipped: needs torchvision (")
        assert note.endswith("): pip install torch==2.14.1 torchvision==0.29.1")


@pytest.mark.parametrize("name", ["torchvision", "torchvision-io"])
# torchvision 0.29 deprecates its decoders for TorchCodec's; decode_jpeg still works.
@pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
def test_the_torchvision_samples_are_normalized_crops_and_labels(name: str) -> None:
    pytest.importorskip("torchvision", reason="the torchvision workloads need torchvision")
    dataset = WORKLOADS[name].make_dataset(20, True)  # quick: 16 files, twice over
    assert len(dataset) == 32
    image, label = dataset[17]
    assert (tuple(image.shape), str(image.dtype)) == ((3, 224, 224), "torch.float32")
    assert float(image.min()) < 0 < float(image.max())  # normalized
    assert label == 0  # sample 17 is the folder's 2nd: class0 holds its first four files
