"""torch's DataPipes, treated as torch's loader treats them.

A DataPipe graph shuffles and shards itself, steered by its loader:

* ``shuffle`` is handed to the pipe's shufflers (``DataLoader(pipe, shuffle=True)``
  turns them on), instead of choosing a sampler.
* Every iterator draws a *shared seed* from the loader's generator (broadcast from
  rank 0 under ``torch.distributed``) and seeds the pipe's random parts with it, in
  every worker alike: the workers shuffle identically, so sharding after a shuffle
  still splits one order.
* Each worker shards the pipe to its part (``apply_sharding`` over ranks times workers);
  without workers, the pipe is sharded over the ranks.

The draws happen where torch makes them, so a generator shared with a sampler or the
base seed is consumed in the same order. Nothing here runs unless the dataset is a
DataPipe, so torch is loaded already.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from conveyor import _torch


def is_datapipe(dataset: Any) -> bool:
    data = _data_module()
    return data is not None and isinstance(dataset, (data.IterDataPipe, data.MapDataPipe))


def is_iter_datapipe(dataset: Any) -> bool:
    data = _data_module()
    return data is not None and isinstance(dataset, data.IterDataPipe)


def wrap(dataset: Any, shuffle: bool | None) -> Any:
    """What the loader keeps as ``dataset`` (torch's serialization wrapper, which
    pickles the graph with dill where needed), with ``shuffle`` handed to the graph's
    shufflers. As in torch, a shuffler that has to be added for ``shuffle=True`` is
    added to a graph the loader does not keep (torch warns that it adds one)."""
    data = _data_module()
    assert data is not None
    from torch.utils.data import graph_settings
    from torch.utils.data.datapipes.datapipe import (
        _IterDataPipeSerializationWrapper,
        _MapDataPipeSerializationWrapper,
    )

    if isinstance(dataset, data.IterDataPipe):
        kept = _IterDataPipeSerializationWrapper(dataset)
        if shuffle is not None:
            graph_settings.apply_shuffle_settings(dataset, shuffle=shuffle)
        return kept
    return _MapDataPipeSerializationWrapper(dataset)


def reducers() -> dict[type, Callable[[Any], tuple[Any, ...]]]:
    """Reducers for the pickler that sends the dataset to the workers.

    torch's wrapper pickles its graph with plain pickle, inside its own state, so the
    graph's functions travel by reference: a lambda, or a function from a ``__main__``
    our spawn workers do not re-run, would not load. Handing the graph to the enclosing
    pickler (cloudpickle) sends those by value. Empty while torch is not loaded, as no
    DataPipe can exist then."""
    if "torch" not in sys.modules:
        return {}
    from torch.utils.data.datapipes.datapipe import (
        _IterDataPipeSerializationWrapper,
        _MapDataPipeSerializationWrapper,
    )

    return {
        _IterDataPipeSerializationWrapper: _reduce_wrapper,
        _MapDataPipeSerializationWrapper: _reduce_wrapper,
    }


def _reduce_wrapper(wrapper: Any) -> tuple[Any, ...]:
    return (type(wrapper), (wrapper._datapipe,))


class SharedSeeds:
    """Draws the per-iterator shared seeds, as torch's iterator does: from the loader's
    generator, broadcast from rank 0 over a gloo group made once per iterator."""

    def __init__(self) -> None:
        torch = _torch.require()
        dist = torch.distributed
        self._group = None
        if dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")

    def draw(self, generator: Any, dataset: Any) -> int:
        """A new shared seed; the main process's copy of ``dataset`` is seeded with it."""
        torch = _torch.require()
        seed = torch.empty((), dtype=torch.int64).random_(generator=generator)
        if self._group is not None:
            torch.distributed.broadcast(seed, src=0, group=self._group)
        value = int(seed.item())
        seed_graph(dataset, value)
        return value


def seed_graph(dataset: Any, seed: int) -> None:
    """Seed every random DataPipe in the graph from ``seed`` (in the graph's order)."""
    torch = _torch.require()
    from torch.utils.data import graph_settings

    rng = torch.Generator()
    rng.manual_seed(seed)
    graph_settings.apply_random_seed(dataset, rng)


def shard(dataset: Any, worker_id: int = 0, num_workers: int = 1) -> None:
    """Shard the graph to this worker's part: over the ranks first, then the workers."""
    from torch.utils.data import graph_settings

    world, rank = _ranks()
    graph_settings.apply_sharding(dataset, num_workers * world, worker_id * world + rank)


def _ranks() -> tuple[int, int]:
    dist = _torch.require().distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _data_module() -> Any:
    torch = _torch.load()
    return torch.utils.data if torch is not None else None
