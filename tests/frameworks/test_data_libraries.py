"""Hugging Face datasets and webdataset through conveyor: the batches torch's loader
gives, with conveyor's workers loading them."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader

pytest.importorskip("torch", reason="compares with torch's DataLoader: needs torch")
from torch.utils.data import DataLoader as TorchDataLoader

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _both(dataset: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
    def run(cls: Any) -> list[Any]:
        return [{k: _plain(v) for k, v in b.items()} for b in cls(dataset, **kwargs)]

    return run(TorchDataLoader), run(DataLoader)


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def test_hugging_face_map_style_and_arrow_backed_columns() -> None:
    datasets = pytest.importorskip("datasets", reason="CI installs datasets (.ci/run)")
    table = datasets.Dataset.from_dict(
        {
            "pixels": [np.full((4, 4), i, dtype=np.uint8) for i in range(12)],
            "text": [f"sample {i}" for i in range(12)],
            "label": list(range(12)),
        }
    )
    for form in (None, "torch", "numpy"):
        data = table.with_format(form) if form else table
        theirs, ours = _both(data, batch_size=4, num_workers=2)
        assert ours == theirs, form


def test_hugging_face_iterable_and_split_by_node() -> None:
    datasets = pytest.importorskip("datasets", reason="CI installs datasets (.ci/run)")
    from datasets.distributed import split_dataset_by_node

    table = datasets.Dataset.from_dict({"label": list(range(20))}).with_format("torch")
    stream = table.to_iterable_dataset(num_shards=4)
    shards = []
    for rank in (0, 1):
        node = split_dataset_by_node(stream, rank=rank, world_size=2)
        theirs, ours = _both(node, batch_size=4, num_workers=2)
        assert ours == theirs
        shards += [i for batch in ours for i in batch["label"]]
    assert sorted(shards) == list(range(20))


# The pre-flight names the shuffle's generator, the same in every worker: datasets' design
# (each worker shuffles its own shards with it).
@pytest.mark.filterwarnings("ignore::conveyor.PreflightWarning")
@pytest.mark.parametrize(
    "kind",
    [{"multiprocessing_context": m} for m in ("fork", "spawn")] + [{"worker_method": "thread"}],
    ids=["fork", "spawn", "thread"],
)
def test_hugging_face_set_epoch_reshuffles_each_epoch_with_persistent_workers(
    kind: dict[str, Any],
) -> None:
    """``datasets.IterableDataset.set_epoch`` (its own, on the real class) reshuffles each
    epoch: persistent workers give each epoch the order workers started afresh give it.
    (datasets keeps the epoch in a shared torch tensor, which forked and threads' copies
    share; a spawned (or forkserver) copy gets its own, which conveyor tells of each call.)"""
    datasets = pytest.importorskip("datasets", reason="CI installs datasets (.ci/run)")
    table = datasets.Dataset.from_dict({"label": list(range(32))}).with_format("torch")
    stream = table.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=8)
    assert type(stream) is datasets.IterableDataset

    def epochs(persistent: bool) -> list[list[int]]:
        loader = DataLoader(
            stream, batch_size=4, num_workers=2, persistent_workers=persistent, **kind
        )
        orders = []
        for epoch in range(3):
            stream.set_epoch(epoch)
            orders.append([int(i) for batch in loader for i in batch["label"]])
        return orders

    fresh, persistent = epochs(False), epochs(True)
    assert persistent == fresh
    assert all(sorted(order) == list(range(32)) for order in persistent)
    assert len({tuple(order) for order in persistent}) == 3, "an epoch repeated another's order"


def _shards(root: Path) -> str:
    for shard in range(2):
        with tarfile.open(root / f"s{shard}.tar", "w") as tar:
            for i in range(8):
                data = str(shard * 8 + i).encode()
                info = tarfile.TarInfo(f"{shard * 8 + i:05d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(root / "s{0..1}.tar")


def test_webdataset_through_conveyor_and_in_a_pipeline(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset", reason="CI installs webdataset (.ci/run)")
    urls = _shards(tmp_path)

    def loaders(cls: Any) -> list[Any]:
        dataset = wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("txt")
        loader = cls(dataset, batch_size=4, num_workers=2)
        pipeline = wds.DataPipeline(loader, wds.unbatched(), wds.batched(3))
        return [list(b[0]) for b in pipeline]

    theirs, ours = loaders(TorchDataLoader), loaders(DataLoader)
    assert ours == theirs
    assert sorted(int(x) for batch in ours for x in batch) == list(range(16))
