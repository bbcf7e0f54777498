"""A framework's eye sees torch's loader (DESIGN.md, invariant 11): the exact classes and
attributes torch's ``DataLoader`` holds for the same arguments, copies and pickles of an
iterated loader, an iterator that refuses to be pickled, and torch's ``_get_iterator``
and ``_iterator`` hooks honoured. (Lightning's and accelerate's rebuilds:
tests/frameworks.)"""

from __future__ import annotations

import copy
import itertools
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conveyor

torch = pytest.importorskip("torch", reason="torch's classes are what a loader must hold")
tud = torch.utils.data


class Squares(tud.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i * i


class Stream(tud.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[int]:
        return iter(range(10))

    def __len__(self) -> int:
        return 10


MAP, STREAM = Squares(), Stream()
ORDER = [3, 1, 4, 0, 5, 9, 2, 6, 8, 7]  # a user's sampler: any iterable of indices
BATCHES = [[0, 1, 2], [5], [9, 8]]  # a user's batch sampler

# Every value of each argument that torch's loader reads to choose its samplers.
GRID = list(
    itertools.product(
        (MAP, STREAM),
        (1, 4, None),  # batch_size
        (None, False, True),  # shuffle
        (None, ORDER),  # sampler
        (None, BATCHES),  # batch_sampler
        (False, True),  # drop_last
    )
)


def _view(loader: Any) -> dict[str, Any]:
    """What a framework reads of a loader: the classes and the attributes it decides by."""

    def part(x: Any) -> Any:
        if x is ORDER or x is BATCHES or x is None:
            return x  # a user's own object: held as given
        inner = getattr(x, "sampler", None)
        return (
            type(x),
            getattr(x, "data_source", None) is MAP,
            getattr(x, "generator", "none"),
            getattr(x, "batch_size", None),
            getattr(x, "drop_last", None),
            part(inner) if inner is not None else None,
        )

    view = {
        "sampler": part(loader.sampler),
        "batch_sampler": part(loader.batch_sampler),
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "_auto_collation": loader._auto_collation,
        "_index_sampler": part(loader._index_sampler),
        "_dataset_kind": loader._dataset_kind,
        "collate_fn": loader.collate_fn.__name__,  # conveyor's own, same name and batches
    }
    try:
        view["len"] = len(loader)
    except TypeError:
        view["len"] = TypeError
    return view


def _made(kind: Any, args: tuple[Any, ...]) -> Any:
    dataset, batch_size, shuffle, sampler, batch_sampler, drop_last = args
    try:
        return kind(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, drop_last=drop_last,
        )  # fmt: skip
    except Exception as error:  # torch refuses the combination: conveyor must, alike
        return type(error)


def test_every_combination_torch_accepts_holds_torchs_exact_classes() -> None:
    accepted = 0
    for args in GRID:
        theirs, ours = _made(tud.DataLoader, args), _made(conveyor.DataLoader, args)
        if isinstance(theirs, type):
            assert ours is theirs, args  # refused, with torch's exception type
            continue
        accepted += 1
        assert _view(ours) == _view(theirs), args
    assert accepted == 37  # the table covers what torch accepts, not only its refusals


@pytest.mark.parametrize("shuffle", [False, True])
def test_lightnings_check_sees_torchs_batch_sampler(shuffle: bool) -> None:
    """Lightning injects its DistributedSampler only into ``type(x) is BatchSampler``;
    accelerate and Lightning decide shuffling by ``isinstance(sampler, RandomSampler)``."""
    loader = conveyor.DataLoader(MAP, batch_size=4, shuffle=shuffle)
    assert type(loader.batch_sampler) is tud.BatchSampler
    assert type(loader.sampler) is (tud.RandomSampler if shuffle else tud.SequentialSampler)
    assert loader.batch_sampler.sampler is loader.sampler
    iterable = conveyor.DataLoader(STREAM, batch_size=4)
    assert type(iterable.sampler) is tud.dataloader._InfiniteConstantSampler


def test_a_numpy_generator_keeps_conveyors_sampler_which_torchs_cannot_draw_from() -> None:
    import numpy as np

    loader = conveyor.DataLoader(
        MAP, batch_size=4, shuffle=True, generator=np.random.default_rng(0)
    )
    assert type(loader.sampler) is conveyor.RandomSampler  # a subclass of torch's
    assert type(loader.batch_sampler) is tud.BatchSampler
    assert sorted(i for batch in loader for i in batch.tolist()) == sorted(
        MAP[i] for i in range(10)
    )


# --- copies -------------------------------------------------------------------------------

KINDS = [
    pytest.param(dict(num_workers=0), id="in-process"),
    pytest.param(dict(num_workers=2), id="processes"),
    pytest.param(dict(num_workers=2, persistent_workers=True), id="persistent-processes"),
    pytest.param(dict(num_workers=2, worker_method="thread"), id="threads"),
    pytest.param(
        dict(num_workers=2, worker_method="thread", persistent_workers=True),
        id="persistent-threads",
    ),
]


def _samples(loader: Any) -> list[int]:
    return sorted(i for batch in loader for i in batch.tolist())


@pytest.mark.parametrize("kind", KINDS)
def test_an_iterated_loader_pickles_and_deep_copies_as_torchs(
    kind: dict[str, Any], tmp_path: Path
) -> None:
    """torch's loader pickles once a batch was seen (a ``ddp_spawn`` fit pickles it, and so
    does pickling Lightning's ``CombinedLoader``); the copy's ``iter()`` starts afresh."""
    loader = conveyor.DataLoader(
        MAP, batch_size=3, shuffle=True, on_error="skip", reseed="batch", **kind
    )
    iterator = iter(loader)
    next(iterator)
    with loader.trace(tmp_path / "trace.json"):  # a tracer attached meanwhile is not copied
        copies = [pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)]
    for copied in copies:
        assert type(copied) is conveyor.DataLoader
        assert (copied.on_error, copied.reseed, copied.num_workers) == (
            "skip", "batch", kind["num_workers"],
        )  # fmt: skip
        assert type(copied.batch_sampler) is tud.BatchSampler
        assert _samples(copied) == sorted(MAP[i] for i in range(10))
        assert copied._history.tracer is None
    assert sum(len(batch) for batch in iterator) == 10 - 3  # the original goes on


@pytest.mark.parametrize("kind", KINDS)
def test_its_iterator_refuses_pickling_and_copying_as_torchs(kind: dict[str, Any]) -> None:
    loader = conveyor.DataLoader(MAP, batch_size=3, **kind)
    iterator = iter(loader)
    next(iterator)
    torchs = iter(tud.DataLoader(MAP, batch_size=3))
    for attempt in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(NotImplementedError):
            attempt(torchs)
        with pytest.raises(NotImplementedError, match=r"cannot be pickled.*loader\.state_dict"):
            attempt(iterator)
    assert sum(len(batch) for batch in iterator) == 10 - 3  # unharmed
    state = loader.state_dict()  # what to keep instead: plain data
    assert pickle.loads(pickle.dumps(state)) == state


def test_a_loaded_state_waiting_for_iter_is_copied_with_the_loader() -> None:
    loader = conveyor.DataLoader(MAP, batch_size=3)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    fresh = conveyor.DataLoader(MAP, batch_size=3)
    fresh.load_state_dict(state)
    copied = copy.deepcopy(fresh)
    assert [b.tolist() for b in copied] == [b.tolist() for b in iterator]


# --- torch's hooks ---------------------------------------------------------------------------


class Counted(conveyor.DataLoader):
    """A subclass that wraps ``_get_iterator`` as code written for torch's loader does."""

    made = 0

    def _get_iterator(self) -> Any:
        type(self).made += 1
        return super()._get_iterator()


@pytest.mark.parametrize("kind", KINDS)
def test_a_subclass_overriding_get_iterator_is_honoured(kind: dict[str, Any]) -> None:
    Counted.made = 0
    loader = Counted(MAP, batch_size=4, **kind)
    for _ in range(2):
        assert _samples(loader) == sorted(MAP[i] for i in range(10))
    # torch calls it for every epoch, or once for persistent workers (then _reset).
    assert Counted.made == (1 if kind.get("persistent_workers") else 2)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "persistent-processes"])
def test_a_subclass_returning_torchs_own_iterator_gets_it(workers: int) -> None:
    """torch's iterators read the loader's attributes (``_dataset_kind``, ``_index_sampler``,
    ``_auto_collation``...) and persistent ones are ``_reset(loader)`` each epoch."""
    made = tud.dataloader._MultiProcessingDataLoaderIter if workers else None

    class TorchIterating(conveyor.DataLoader):
        def _get_iterator(self) -> Any:
            if made is None:
                return tud.dataloader._SingleProcessDataLoaderIter(self)
            return made(self)

    loader = TorchIterating(MAP, batch_size=4, shuffle=True, num_workers=workers,
                            persistent_workers=workers > 0)  # fmt: skip
    for _ in range(2):
        iterator = iter(loader)
        assert type(iterator).__module__ == "torch.utils.data.dataloader"  # torch's own
        assert sorted(i for b in iterator for i in b.tolist()) == sorted(MAP[i] for i in range(10))
    if workers:
        assert loader._iterator is iterator  # kept and reset, as torch's __iter__ does
        iterator._shutdown_workers()


def test_setting_iterator_to_none_shuts_the_persistent_workers_down_as_torchs() -> None:
    """Lightning's ``_shutdown_workers_and_reset_iterator`` sets ``loader._iterator = None``
    (after shutting torch's down itself): conveyor's workers stop there too."""
    loader = conveyor.DataLoader(MAP, batch_size=4, num_workers=2, persistent_workers=True)
    _samples(loader)
    kept = loader._iterator
    workers = kept._workers
    assert workers and all(w.is_alive() for w in workers)
    loader._iterator = None
    assert kept.closed
    for worker in workers:
        worker.join(timeout=30)
        assert not worker.is_alive()
    assert _samples(loader) == sorted(MAP[i] for i in range(10))  # a new iterator next time
