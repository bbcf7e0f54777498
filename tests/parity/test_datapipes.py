"""torch's DataPipes through conveyor: the same batches as torch's loader.

A DataPipe graph shuffles and shards itself. The loader hands ``shuffle`` to its
shufflers, seeds them from its generator with a seed every worker shares (so that the
workers shuffle alike and ``sharding_filter`` splits one order), and shards it over
ranks times workers. Each case runs torch's loader and conveyor's with the same arguments
and a seeded generator and compares every batch of every epoch.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402
from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402
from torch.utils.data.datapipes.map import SequenceWrapper  # noqa: E402

import conveyor  # noqa: E402
from tests.helpers.leaks import no_leaks  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]


def triple(x: int) -> int:
    return 3 * x


def shuffled_then_sharded(n: int = 40) -> Any:
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(triple)


def sharded_then_shuffled(n: int = 40) -> Any:
    return IterableWrapper(range(n)).sharding_filter().shuffle(buffer_size=8).map(triple)


def mapped(n: int = 17) -> Any:
    return SequenceWrapper(list(range(n))).map(triple)


def epochs_of(cls: type, make: Callable[[], Any], epochs: int, **kwargs: Any) -> list[Any]:
    loader = cls(make(), generator=torch.Generator().manual_seed(11), **kwargs)
    return [[batch.tolist() for batch in loader] for _ in range(epochs)]


CASES = [
    pytest.param(shuffled_then_sharded, dict(batch_size=4), id="w0"),
    pytest.param(shuffled_then_sharded, dict(batch_size=4, shuffle=True), id="w0-shuffle"),
    pytest.param(
        shuffled_then_sharded, dict(batch_size=4, shuffle=False, num_workers=2), id="w2-shuffle-off"
    ),
    pytest.param(
        shuffled_then_sharded, dict(batch_size=4, shuffle=True, num_workers=2), id="w2-shuffle"
    ),
    pytest.param(
        sharded_then_shuffled, dict(batch_size=3, shuffle=True, num_workers=3), id="w3-shard-first"
    ),
    pytest.param(
        shuffled_then_sharded,
        dict(batch_size=4, shuffle=True, num_workers=2, persistent_workers=True),
        id="w2-persistent",
    ),
    pytest.param(
        shuffled_then_sharded,
        dict(
            batch_size=4,
            shuffle=True,
            num_workers=2,
            multiprocessing_context="spawn",
            persistent_workers=True,
        ),
        id="w2-spawn-persistent",
        marks=pytest.mark.slow,  # spawn workers import torch: seconds each
    ),
    pytest.param(
        shuffled_then_sharded,
        dict(batch_size=4, shuffle=True, num_workers=1, multiprocessing_context="forkserver"),
        id="w1-forkserver",
        marks=pytest.mark.slow,
    ),
    pytest.param(mapped, dict(batch_size=4, shuffle=True), id="map-w0-shuffle"),
    pytest.param(mapped, dict(batch_size=4, shuffle=True, num_workers=2), id="map-w2-shuffle"),
]


@pytest.mark.parametrize(("make", "kwargs"), CASES)
def test_same_batches_as_torch(make: Callable[[], Any], kwargs: dict[str, Any]) -> None:
    expected = epochs_of(TorchDataLoader, make, 3, **kwargs)
    with no_leaks():
        got = epochs_of(conveyor.DataLoader, make, 3, **kwargs)
    assert got == expected
    if kwargs.get("shuffle"):  # the epochs differ: each iterator draws a new shared seed
        assert got[0] != got[1]


def test_the_loader_keeps_torchs_wrapper() -> None:
    pipe = shuffled_then_sharded()
    ours, theirs = conveyor.DataLoader(pipe), TorchDataLoader(pipe)
    assert type(ours.dataset) is type(theirs.dataset)
    assert ours.dataset._datapipe is pipe


def _mapped_by_a_lambda() -> Any:
    """torch pickles a graph with dill if installed, else with pickle, and without dill
    says at once that a lambda in it will not pickle. conveyor's workers get the graph
    with cloudpickle, as every other dataset, so it works either way."""
    if importlib.util.find_spec("dill") is not None:
        return IterableWrapper(range(12)).sharding_filter().map(lambda x: x + 100)
    with pytest.warns(UserWarning, match="function is not supported by pickle"):
        return IterableWrapper(range(12)).sharding_filter().map(lambda x: x + 100)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_lambda_in_the_graph_reaches_the_workers(method: str) -> None:
    pipe = _mapped_by_a_lambda()
    loader = conveyor.DataLoader(pipe, batch_size=5, num_workers=2, multiprocessing_context=method)
    items = [i for batch in loader for i in batch.tolist()]
    assert sorted(items) == list(range(100, 112))


def test_no_shared_generator_warning_for_a_datapipe() -> None:
    # The loader seeds the graph's shufflers itself: they must start alike.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loader = conveyor.DataLoader(shuffled_then_sharded(), shuffle=True, num_workers=2)
        assert len([batch.tolist() for batch in loader]) == 40
    assert [str(w.message) for w in record] == []


# --- two ranks ---------------------------------------------------------------------


def _rank_main(rank: int, store_path: str, out: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        kwargs = dict(batch_size=3, shuffle=True, num_workers=2)
        # Each rank's generator differs: the shared seed is rank 0's, broadcast.
        generator = torch.Generator().manual_seed(rank)
        result = {}
        for name, cls in (("torch", TorchDataLoader), ("conveyor", conveyor.DataLoader)):
            generator.manual_seed(rank)
            loader = cls(shuffled_then_sharded(), generator=generator, **kwargs)
            result[name] = [[b.tolist() for b in loader] for _ in range(2)]
        out.put((rank, result))
    finally:
        dist.destroy_process_group()


def test_two_ranks_shard_like_torch(tmp_path: Any) -> None:
    context = multiprocessing.get_context("fork")
    out = context.SimpleQueue()
    store = os.fspath(tmp_path / "store")
    with no_leaks():
        ranks = [context.Process(target=_rank_main, args=(r, store, out)) for r in range(2)]
        for process in ranks:
            process.start()
        results = dict(out.get() for _ in ranks)
        for process in ranks:
            process.join()
            assert process.exitcode == 0
    for rank in range(2):
        assert results[rank]["conveyor"] == results[rank]["torch"], f"rank {rank}"
    for epoch in range(2):
        union = sorted(
            i for rank in range(2) for batch in results[rank]["conveyor"][epoch] for i in batch
        )
        assert union == [triple(i) for i in range(40)]
