"""What code that inspects a loader sees is what torch's loader shows (issue 43).

Frameworks check ``type(loader.batch_sampler) is torch.utils.data.BatchSampler`` (Lightning
takes another path for anything else), read ``sampler``/``batch_size``/``drop_last`` to
rebuild a loader, pickle loaders (``ddp_spawn``) and expect torch's errors from iterators.
"""

from __future__ import annotations

import copy
import itertools
import pickle
import warnings
from typing import Any

import pytest

import conveyor

torch = pytest.importorskip("torch")
data = torch.utils.data

N = 10


class Custom(data.Sampler):  # a user's own sampler: kept as given
    def __iter__(self) -> Any:
        return iter(range(N - 1, -1, -1))

    def __len__(self) -> int:
        return N


class CustomBatches(data.Sampler):  # a user's own batch sampler
    def __iter__(self) -> Any:
        return iter([[0, 1], [2, 3, 4], [9]])

    def __len__(self) -> int:
        return 3


def _build(kind: Any, arguments: dict[str, Any]) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return kind(list(range(N)), **arguments)
    except Exception as error:  # the combinations torch refuses
        return type(error)


def _combinations() -> list[dict[str, Any]]:
    found = []
    for batch_size, shuffle, sampler, batch_sampler, drop_last in itertools.product(
        (1, 4, None), (None, False, True), (None, "custom"), (None, "custom"), (False, True)
    ):
        arguments: dict[str, Any] = {"batch_size": batch_size, "drop_last": drop_last}
        if shuffle is not None:
            arguments["shuffle"] = shuffle
        if sampler:
            arguments["sampler"] = Custom()
        if batch_sampler:
            arguments["batch_sampler"] = CustomBatches()
        found.append(arguments)
    return found


def _name(arguments: dict[str, Any]) -> str:
    return ",".join(
        f"{key}={'custom' if key.endswith('sampler') else value}"
        for key, value in arguments.items()
    )


@pytest.mark.parametrize("arguments", _combinations(), ids=_name)
def test_every_combination_holds_torchs_classes_and_values(arguments: dict[str, Any]) -> None:
    ours, theirs = _build(conveyor.DataLoader, arguments), _build(data.DataLoader, arguments)
    if isinstance(theirs, type):
        assert ours is theirs or (isinstance(ours, type) and issubclass(ours, theirs))
        return
    assert type(ours.sampler) is type(theirs.sampler)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler)
    assert (ours.batch_size, ours.drop_last) == (theirs.batch_size, theirs.drop_last)
    assert ours._auto_collation == theirs._auto_collation
    assert type(ours._index_sampler) is type(theirs._index_sampler)
    assert len(ours) == len(theirs)
    torch.manual_seed(7)
    got = [b.tolist() if hasattr(b, "tolist") else b for b in ours]
    torch.manual_seed(7)
    want = [b.tolist() if hasattr(b, "tolist") else b for b in theirs]
    assert got == want


def test_an_iterable_dataset_holds_torchs_infinite_sampler() -> None:
    class Stream(data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(5))

    ours, theirs = conveyor.DataLoader(Stream(), batch_size=2), data.DataLoader(Stream(), 2)
    assert type(ours.sampler) is type(theirs.sampler)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler)


def test_a_generator_only_conveyor_takes_keeps_conveyors_sampler() -> None:
    """An int seed or a NumPy generator is conveyor's own: its RandomSampler draws from it
    (torch's would refuse it); the batch sampler is still torch's."""
    loader = conveyor.DataLoader(list(range(N)), batch_size=2, shuffle=True, generator=3)
    assert type(loader.sampler) is conveyor.RandomSampler
    assert type(loader.batch_sampler) is data.BatchSampler
    assert isinstance(loader.sampler, data.RandomSampler)  # a twin to isinstance checks
    assert sorted(i for b in loader for i in b.tolist()) == list(range(N))


KINDS = [
    pytest.param({}, id="num_workers=0"),
    pytest.param({"num_workers": 2}, id="processes"),
    pytest.param({"num_workers": 2, "persistent_workers": True}, id="persistent"),
    pytest.param({"num_workers": 2, "worker_method": "thread"}, id="threads"),
    pytest.param({"num_workers": 1, "threads_per_worker": 2}, id="threads-per-process"),
]


@pytest.mark.parametrize("options", KINDS)
def test_an_iterated_loader_pickles_and_deep_copies_as_torchs(options: dict[str, Any]) -> None:
    """torch's loader pickles after a batch was taken (Lightning's ddp_spawn pickles the
    loaders, and CombinedLoader with them); the copy starts a fresh epoch."""
    loader = conveyor.DataLoader(list(range(12)), batch_size=4, shuffle=True, **options)
    iterator = iter(loader)
    first = next(iterator)
    for copied in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert type(copied.batch_sampler) is data.BatchSampler
        assert copied.on_error == loader.on_error and copied.num_workers == loader.num_workers
        batches = [b.tolist() for b in copied]
        assert sorted(i for b in batches for i in b) == list(range(12))
    rest = [b.tolist() for b in iterator]  # the original pass goes on where it was
    assert sorted([*first.tolist(), *(i for b in rest for i in b)]) == list(range(12))


@pytest.mark.parametrize("options", KINDS)
def test_its_iterator_refuses_pickling_with_torchs_exception(options: dict[str, Any]) -> None:
    loader = conveyor.DataLoader(list(range(12)), batch_size=4, **options)
    iterator = iter(loader)
    next(iterator)
    theirs = iter(data.DataLoader(list(range(12)), batch_size=4))
    with pytest.raises(NotImplementedError):
        pickle.dumps(theirs)
    with pytest.raises(NotImplementedError, match="cannot be pickled"):
        pickle.dumps(iterator)
    with pytest.raises(NotImplementedError, match="cannot be pickled"):
        copy.deepcopy(iterator)
    assert len(list(iterator)) == 2  # and the pass goes on


@pytest.mark.parametrize(
    "options", [{}, {"num_workers": 1}, {"num_workers": 1, "persistent_workers": True}]
)
def test_a_subclass_get_iterator_is_honoured(options: dict[str, Any]) -> None:
    """torch's __iter__ asks self._get_iterator() for a new pass: a subclass overriding it
    (to wrap or count passes) is used, as with torch's loader."""

    class Counting(conveyor.DataLoader):
        made = 0

        def _get_iterator(self) -> Any:
            type(self).made += 1
            return super()._get_iterator()

    loader = Counting(list(range(8)), batch_size=4, **options)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(list(loader)) == 2
    assert Counting.made == (1 if options.get("persistent_workers") else 2)
