"""default_collate honours torch's ``default_collate_fn_map`` and conveyor's own, as
torch's ``collate`` does: the lookup, what functions are given, errors, numpy_collate,
the deferred-torch worker path, and the snapshot workers get. Loaders with workers:
tests/parity/test_collate_fn_map.py and tests/integration/test_collate_registry.py."""

from __future__ import annotations

import abc
import collections
import pickle
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import cloudpickle
import numpy as np
import pytest
from tests.helpers.collate_maps import restored_collate_maps

import conveyor
from conveyor import collate as conveyor_collate
from conveyor._workers import scope as _scope
from conveyor.collate import (
    collate,
    collate_context,
    default_collate,
    default_collate_fn_map,
    numpy_collate,
)
from conveyor.errors import CollateTypeError, UnpicklableError

torch = pytest.importorskip("torch")
from tests.parity.test_torch_parity import assert_batches_equal  # noqa: E402
from torch.utils.data import default_collate as torch_default_collate  # noqa: E402
from torch.utils.data._utils.collate import collate as torch_collate  # noqa: E402
from torch.utils.data._utils.collate import (  # noqa: E402
    default_collate_fn_map as torch_map,
)


@pytest.fixture(autouse=True)
def collate_maps() -> Iterator[Callable[[], None]]:
    with restored_collate_maps() as restore:
        yield restore


class Box:
    def __init__(self, value: Any) -> None:
        self.value = value


class SubBox(Box):
    pass


class Other:
    pass


class Labelled(NamedTuple):
    box: Any
    label: int


def boxes(batch: Sequence[Box], *, collate_fn_map: Any = None) -> Any:
    return ("boxes", torch_collate([b.value for b in batch], collate_fn_map=collate_fn_map))


def box_values(batch: Sequence[Box], *, collate_fn_map: Any = None) -> list[Any]:
    return [b.value for b in batch]


def kinds(batch: Sequence[Any], *, collate_fn_map: Any = None) -> str:
    return type(batch[0]).__name__


def samples() -> list[Any]:
    return [
        {
            "box": (SubBox if i % 2 else Box)(np.full(2, i, np.float32)),
            "nested": [Labelled(Box(i), i), (Box(i / 2), "s")],
            "x": np.arange(3) + i,
            "f": i * 0.5,
            "t": torch.tensor([i]),
        }
        for i in range(4)
    ]


def assert_like_torch(batch_factory: Callable[[], Any] = samples) -> None:
    """conveyor's default_collate gives what torch's does (or raises the same type)."""
    try:
        expected = torch_default_collate(batch_factory())
    except Exception as exc:
        with pytest.raises(type(exc)):
            default_collate(batch_factory())
        return
    assert_batches_equal(default_collate(batch_factory()), expected)


# ---------------------------------------------------------------- torch's lookup


@pytest.mark.parametrize(
    "entries",
    [
        {Box: boxes},
        {SubBox: box_values, Box: boxes},  # the exact type before an earlier isinstance match
        {(Other, Box): box_values},  # a tuple of types as the key
        {Box: boxes, float: kinds, int: kinds},  # torch's own rules replaced
        {Box: boxes, torch.Tensor: kinds},  # arrays go through the tensor entry too
        {Box: boxes, np.ndarray: kinds},
        {Mapping: kinds},  # an ABC: every dict, by isinstance
        {tuple: kinds, Box: boxes},  # a namedtuple is a tuple: its entry wins over containers
        {object: kinds},  # after torch's leaf types, before its containers
        {Labelled: kinds, Box: box_values},
    ],
    ids=[
        "type",
        "exact-before-isinstance",
        "tuple-key",
        "numbers-replaced",
        "tensor-replaced",
        "array-replaced",
        "mapping-abc",
        "tuple",
        "object",
        "namedtuple",
    ],
)
def test_registered_in_torchs_map_like_torch(entries: dict[Any, Any]) -> None:
    torch_map.update(entries)
    assert_like_torch()


def test_removed_default_entry_like_torch() -> None:
    """Without torch's entry for bytes, bytes are sequences of ints."""
    del torch_map[bytes]
    assert_like_torch(lambda: [{"raw": b"ab", "n": 1}, {"raw": b"cd", "n": 2}])


def test_unregistered_type_is_still_explained() -> None:
    torch_map[Box] = boxes
    with pytest.raises(CollateTypeError, match=r"Cannot batch values of type .*Other at \['o'\]"):
        default_collate([{"o": Other(), "b": Box(1)}, {"o": Other(), "b": Box(2)}])


def test_a_registration_is_seen_by_the_next_batch() -> None:
    with pytest.raises(CollateTypeError):
        default_collate([Box(1), Box(2)])
    torch_map[Box] = box_values
    assert default_collate([Box(1), Box(2)]) == [1, 2]
    torch_map[Box] = boxes
    assert_batches_equal(default_collate([Box(1), Box(2)]), ("boxes", torch.tensor([1, 2])))
    del torch_map[Box]
    with pytest.raises(CollateTypeError):
        default_collate([Box(1), Box(2)])


def test_no_lookup_while_both_maps_hold_only_their_defaults(
    collate_maps: Callable[[], None],
) -> None:
    registry = conveyor_collate._registry
    assert registry.both() is None and registry.own_only() is None
    torch_map[Box] = boxes
    assert registry.both() is not None
    collate_maps()
    assert registry.both() is None
    default_collate_fn_map[float] = default_collate_fn_map[float]  # the same entry again
    assert registry.both() is None and registry.own_only() is None


def test_a_virtual_subclass_registered_later_is_found() -> None:
    class Registrable(abc.ABC):  # noqa: B024
        pass

    torch_map[Registrable] = kinds
    assert_like_torch(lambda: [Box(1), Box(2)])  # not yet: Box is not a Registrable
    Registrable.register(Box)
    assert default_collate([Box(1), Box(2)]) == "Box"
    assert_like_torch(lambda: [Box(1), Box(2)])


def test_isinstance_is_asked_of_the_element_when_it_names_another_class() -> None:
    """A proxy (``__class__`` is not its type) is matched per object, as torch does."""

    class Proxy:
        def __init__(self, target: Any) -> None:
            self._target = target

        def __getattr__(self, name: str) -> Any:
            return getattr(self._target, name)

        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return type(self._target)

    torch_map[Box] = box_values
    assert default_collate([Proxy(Box(1)), Box(2)]) == [1, 2]
    assert_like_torch(lambda: [Proxy(Box(1)), Box(2)])
    assert_like_torch(lambda: [Proxy(Other()), Other()])  # not a Box: no entry


# ---------------------------------------------------------------- conveyor's map


def test_conveyors_map_has_torchs_keys_and_default_functions() -> None:
    assert list(default_collate_fn_map) == list(torch_map)
    batch = [1.5, 2.5]
    for key, fn in default_collate_fn_map.items():
        assert fn.__name__ == torch_map[key].__name__
    assert_batches_equal(default_collate_fn_map[float](batch), torch_map[float](batch))
    arrays = [np.ones(2, np.float32), np.zeros(2, np.float32)]
    assert_batches_equal(
        default_collate_fn_map[np.ndarray](arrays, collate_fn_map=default_collate_fn_map),
        torch_map[np.ndarray](arrays, collate_fn_map=torch_map),
    )


def test_conveyors_entry_wins_over_torchs() -> None:
    torch_map[Box] = boxes
    default_collate_fn_map[Box] = box_values
    default_collate_fn_map[float] = kinds
    ours = default_collate(samples())
    torch_map.update({Box: box_values, float: kinds})
    assert_batches_equal(ours, torch_default_collate(samples()))


def test_conveyors_functions_get_both_maps() -> None:
    seen: list[Any] = []

    def spy(batch: Sequence[Box], *, collate_fn_map: Any = None) -> Any:
        seen.append(collate_fn_map)
        return collate([b.value for b in batch], collate_fn_map=collate_fn_map)

    torch_map[Other] = kinds
    default_collate_fn_map[Box] = spy
    out = default_collate([Box(Other()), Box(Other())])
    assert out == "Other"  # torch's entry, through the map conveyor's function was given
    (given,) = seen
    assert given[Box] is spy and given[Other] is kinds


def test_torchs_functions_get_torchs_map() -> None:
    seen: list[Any] = []

    def spy(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
        seen.append(collate_fn_map)
        return len(batch)

    torch_map[Box] = spy
    assert default_collate([Box(1), Box(2)]) == 2
    assert seen == [torch_map] and seen[0] is torch_map


# ---------------------------------------------------------------- collate()


def test_collate_without_a_map_knows_only_containers_like_torch() -> None:
    with pytest.raises(TypeError) as torch_error:
        torch_collate([{"a": 1}, {"a": 2}])
    with pytest.raises(TypeError) as ours:
        collate([{"a": 1}, {"a": 2}])
    assert "found <class 'int'>" in str(torch_error.value) and "found <class 'int'>" in str(
        ours.value
    )
    assert collate([[], []]) == torch_collate([[], []]) == []


@pytest.mark.parametrize("which", ["torch", "conveyor", "custom"])
def test_collate_with_a_map_like_torch(which: str) -> None:
    custom = {Box: boxes, float: kinds, **torch_map}
    maps = {"torch": torch_map, "conveyor": default_collate_fn_map, "custom": custom}
    torch_map[Box] = box_values
    default_collate_fn_map[Box] = box_values
    given = maps[which]
    assert_batches_equal(
        collate(samples(), collate_fn_map=given),
        torch_collate(samples(), collate_fn_map=given),
    )


# ---------------------------------------------------------------- errors


def test_a_registered_functions_error_keeps_its_type_and_names_the_function() -> None:
    def broken(batch: Sequence[Box], *, collate_fn_map: Any = None) -> Any:
        raise ValueError("no boxes today")

    torch_map[Box] = broken
    with (
        collate_context([10, 11]),
        pytest.raises(ValueError, match="no boxes today") as info,
    ):
        default_collate([{"b": Box(1)}, {"b": Box(2)}])
    assert type(info.value) is ValueError
    (note,) = info.value.__notes__
    assert "broken, the collate function registered for" in note
    assert "Box at ['b'], in a batch with dataset indices [10, 11]." in note


# ---------------------------------------------------------------- numpy_collate


def test_numpy_collate_honours_conveyors_map_only() -> None:
    torch_map[Box] = boxes  # makes tensors: not numpy_collate's
    with pytest.raises(CollateTypeError):
        numpy_collate([Box(1), Box(2)])
    default_collate_fn_map[Box] = box_values
    default_collate_fn_map[float] = lambda batch, *, collate_fn_map=None: np.array(
        batch, np.float32
    )
    out = numpy_collate([{"b": Box(1), "f": 0.5, "i": 1}, {"b": Box(2), "f": 1.5, "i": 2}])
    assert out["b"] == [1, 2]
    assert out["f"].dtype == np.float32 and out["i"].dtype == np.int64
    assert type(out["i"]) is np.ndarray


# ---------------------------------------------------------------- a worker deferring torch


@pytest.fixture
def deferring() -> Iterator[_scope.WorkerScope]:
    """Collate as a worker core that leaves making tensors to the main process."""
    with _scope.entered(_scope.WorkerScope(tensors_in_main=True)) as scope:
        yield scope


def test_deferring_worker_keeps_deferring_until_a_registered_function_runs(
    deferring: _scope.WorkerScope,
) -> None:
    torch_map[Box] = box_values
    plain = default_collate([{"x": np.ones(2, np.float32)}] * 2)
    assert type(plain["x"]) is np.ndarray  # stands for a tensor the main process makes
    assert deferring.tensors_in_main
    out = default_collate([{"x": np.ones(2, np.float32), "b": Box(1)}] * 2)
    assert not deferring.tensors_in_main  # the transport now sends arrays as arrays
    assert_batches_equal(out, {"x": torch.ones(2, 2), "b": [1, 1]})


def test_deferring_worker_stops_when_arrays_reach_a_tensor_entry(
    deferring: _scope.WorkerScope,
) -> None:
    torch_map[torch.Tensor] = kinds
    assert default_collate([np.ones(2), np.ones(2)]) == "Tensor"
    assert not deferring.tensors_in_main


def test_deferring_worker_with_a_registered_type_it_does_not_meet(
    deferring: _scope.WorkerScope,
) -> None:
    torch_map[Box] = box_values
    out = default_collate([(1, 2.5), (2, 3.5)])
    assert [type(x) for x in out] == [np.ndarray, np.ndarray]
    assert deferring.tensors_in_main


# ---------------------------------------------------------------- to workers


def test_snapshot_is_none_with_only_defaults_and_carries_both_maps(
    collate_maps: Callable[[], None],
) -> None:
    assert conveyor_collate.registrations() is None
    torch_map[Box] = boxes
    default_collate_fn_map[SubBox] = box_values
    del torch_map[bytes]
    snapshot = conveyor_collate.registrations()
    assert snapshot is not None
    expected = list(torch_map.items()), list(default_collate_fn_map.items())
    sent = cloudpickle.loads(cloudpickle.dumps(snapshot))
    collate_maps()
    conveyor_collate.carry_in(sent)
    try:
        assert list(torch_map.items()) == expected[0]
        assert list(default_collate_fn_map.items()) == expected[1]
    finally:
        conveyor_collate._registry._carried = False


def test_an_unpicklable_registration_is_named(tmp_path: Any) -> None:
    lock = threading.Lock()

    def locked(batch: Sequence[Box], *, collate_fn_map: Any = None) -> Any:
        with lock:
            return len(batch)

    torch_map[Box] = locked
    loader = conveyor.DataLoader(
        [Box(1), Box(2)], batch_size=2, num_workers=1, multiprocessing_context="forkserver"
    )
    with pytest.raises(UnpicklableError) as info:
        list(loader)
    message = str(info.value)
    assert "registered collate function" in message
    assert "torch's default_collate_fn_map[Box].<closure var 'lock'> is a _thread.lock" in message
    assert isinstance(info.value, pickle.PicklingError)


def test_a_snapshot_names_torch_only_where_a_registration_does() -> None:
    default_collate_fn_map[Box] = box_values
    snapshot = conveyor_collate.registrations()
    assert snapshot is not None and snapshot.torch_items is None
    assert snapshot.own_tensor_first
    assert all(key is not torch.Tensor for key, _ in snapshot.own_items)
    torch_map[Box] = boxes
    snapshot = conveyor_collate.registrations()
    assert snapshot is not None and snapshot.torch_items is not None


def test_ordered_registrations_survive_pickling_in_order() -> None:
    torch_map[Box] = boxes
    torch_map[collections.abc.Sequence] = kinds
    snapshot = conveyor_collate.registrations()
    assert snapshot is not None and snapshot.torch_items is not None
    keys = [key for key, _ in pickle.loads(pickle.dumps(snapshot)).torch_items]
    assert keys[-2:] == [Box, collections.abc.Sequence]
