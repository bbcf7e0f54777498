"""conveyor.collate: parity with torch, errors that name the culprit, numpy_collate,
the output allocator, and running without torch."""

from __future__ import annotations

import collections
import contextlib
import enum
import pickle
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest

from conveyor.collate import (
    OUTPUT_ALLOCATOR,
    collate_context,
    default_collate,
    default_convert,
    numpy_collate,
)
from conveyor.errors import CollateError, CollateKeyError, CollateShapeError, CollateTypeError

torch = pytest.importorskip("torch")
from torch.utils.data import default_collate as torch_collate  # noqa: E402
from torch.utils.data import default_convert as torch_convert  # noqa: E402

NUMPY_DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip
TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex64,
]  # fmt: skip


class Point(NamedTuple):
    x: Any
    label: Any


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


class TaggedDict(dict):
    """A mutable mapping with an extra attribute that a clone must keep."""

    tag = "plain"


class FrozenMap(Mapping):
    """An immutable mapping that can be built from a dict."""

    def __init__(self, data: dict[Any, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class FixedMap(FrozenMap):
    """An immutable mapping that cannot be built from a dict (collate falls back to dict)."""

    def __init__(self) -> None:
        super().__init__({"a": 1, "b": np.ones(2)})


class Pair(Sequence):
    """An immutable sequence built from a list."""

    def __init__(self, items: Sequence[Any]) -> None:
        self._items = list(items)

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _tensors(dtype: Any, shape: tuple[int, ...] = (2, 3)) -> list[Any]:
    return [(torch.arange(6).reshape(2, 3)[: shape[0], : shape[1]] + i).to(dtype) for i in range(3)]


# Each case builds a fresh batch: (id, factory).
COLLATE_CASES: list[tuple[str, Callable[[], Any]]] = [
    ("ints", lambda: [1, 2, 3]),
    ("floats", lambda: [1.5, -2.25]),
    ("bools", lambda: [True, False, True]),
    ("int-then-float", lambda: [1, 2.5]),
    ("float-then-int", lambda: [1.5, 2]),
    ("bool-then-int", lambda: [True, 2]),
    ("int-enum", lambda: [Color.RED, Color.BLUE]),
    *[
        (f"np-scalar-{d}", lambda d=d: [np.dtype(d).type(1), np.dtype(d).type(0)])
        for d in NUMPY_DTYPES
    ],
    ("np-scalars-mixed", lambda: [np.float32(1.5), np.float64(2.5)]),
    ("np-0dim", lambda: [np.array(1.5, np.float32), np.array(2.5, np.float32)]),
    *[
        (f"np-array-{d}", lambda d=d: [np.arange(6).reshape(2, 3).astype(d) + i for i in range(3)])
        for d in NUMPY_DTYPES
    ],
    ("np-arrays-mixed-dtypes", lambda: [np.ones(3, np.float32), np.arange(3)]),
    ("np-array-and-list", lambda: [np.ones(2, np.float32), [1, 2]]),
    ("np-transposed", lambda: [np.arange(60.0).reshape(4, 5, 3).transpose(2, 0, 1)] * 2),
    ("np-fortran", lambda: [np.asfortranarray(np.arange(6).reshape(2, 3)) for _ in range(2)]),
    ("np-strided", lambda: [np.arange(20)[::3] for _ in range(2)]),
    ("np-readonly", lambda: [_readonly(np.arange(4.0)) for _ in range(2)]),
    ("np-empty", lambda: [np.zeros((0, 3), np.float32)] * 4),
    ("np-scalar-in-dict", lambda: [{"t": np.int64(5)}] * 2),
    ("images-uint8", lambda: [np.full((3, 8, 8), i, np.uint8) for i in range(64)]),
    *[(f"tensor-{d}", lambda d=d: _tensors(d)) for d in TORCH_DTYPES],
    ("tensor-0dim", lambda: [torch.tensor(1.0), torch.tensor(2.0)]),
    ("tensors-mixed-dtypes", lambda: [torch.ones(2), torch.arange(2)]),
    ("tensor-noncontiguous", lambda: [torch.arange(12.0).reshape(3, 4).t() for _ in range(2)]),
    ("tensor-requires-grad", lambda: [torch.ones(2, requires_grad=True), torch.zeros(2)]),
    ("batch-of-one", lambda: [{"a": np.ones(2), "b": 3, "c": "s"}]),
    ("strings", lambda: ["a", "bc", ""]),
    ("bytes", lambda: [b"a", b"bc"]),
    ("np-str", lambda: [np.str_("a"), np.str_("b")]),
    ("dict-of-arrays", lambda: [{"img": np.ones((2, 2)) * i, "y": i, "w": 0.5} for i in range(4)]),
    (
        "nested-dict",
        lambda: [{"meta": {"id": i, "name": f"n{i}", "pos": (i, i + 0.5)}} for i in range(3)],
    ),
    ("dict-extra-key-ignored", lambda: [{"a": 1}, {"a": 2, "b": 3}]),
    ("ordered-dict", lambda: [collections.OrderedDict(b=np.zeros(2), a=i) for i in range(2)]),
    ("defaultdict", lambda: [collections.defaultdict(list, a=i) for i in range(2)]),
    ("mutable-mapping-subclass", lambda: [TaggedDict(a=i, b=torch.ones(2)) for i in range(2)]),
    ("immutable-mapping", lambda: [FrozenMap({"a": i, "b": np.ones(2)}) for i in range(2)]),
    ("mapping-not-constructible", lambda: [FixedMap(), FixedMap()]),
    ("mappingproxy", lambda: [types.MappingProxyType({"a": i}) for i in range(2)]),
    ("namedtuple", lambda: [Point(np.ones(2) * i, i) for i in range(3)]),
    ("namedtuple-with-strings", lambda: [Point("a", b"x"), Point("b", b"y")]),
    ("tuples", lambda: [(1, 2.0, "a"), (3, 4.0, "b")]),
    ("list-of-tuples", lambda: [[(1, 2), (3, 4)], [(5, 6), (7, 8)]]),
    ("lists", lambda: [[1, 2, 3], [4, 5, 6]]),
    ("empty-lists", lambda: [[], []]),
    ("custom-sequence", lambda: [Pair([1, np.ones(2)]), Pair([2, np.zeros(2)])]),
    ("user-list", lambda: [collections.UserList([1, 2]), collections.UserList([3, 4])]),
    ("range", lambda: [range(3), range(3)]),
    ("bytearray", lambda: [bytearray(b"ab"), bytearray(b"cd")]),
    (
        "dict-in-namedtuple-in-list",
        lambda: [[Point({"k": np.ones(1)}, (1, "s"))] for _ in range(2)],
    ),
]


def assert_same(ours: Any, ref: Any, where: str = "batch") -> None:
    assert type(ours) is type(ref), f"{where}: {type(ours)} != {type(ref)}"
    if isinstance(ref, torch.Tensor):
        assert ours.dtype == ref.dtype, where
        assert ours.shape == ref.shape, where
        assert ours.requires_grad == ref.requires_grad, where
        assert torch.equal(ours.detach(), ref.detach()), where
    elif isinstance(ref, np.ndarray):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, where
        assert np.array_equal(ours, ref), where
    elif isinstance(ref, Mapping):
        assert list(ours) == list(ref), where
        assert getattr(ours, "tag", None) == getattr(ref, "tag", None), where
        for key in ref:
            assert_same(ours[key], ref[key], f"{where}[{key!r}]")
    elif isinstance(ref, (list, tuple, collections.UserList, Pair)):
        assert len(ours) == len(ref), where
        for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == ref, where


def _reference(fn: Callable[[Any], Any], data: Any) -> Any:
    with warnings.catch_warnings():  # torch warns on read-only arrays; conveyor must not
        warnings.simplefilter("ignore")
        return fn(data)


@pytest.mark.parametrize("make", [c[1] for c in COLLATE_CASES], ids=[c[0] for c in COLLATE_CASES])
def test_default_collate_matches_torch(make: Callable[[], Any]) -> None:
    try:
        ref = _reference(torch_collate, make())
    except Exception as exc:  # e.g. numpy uint64 scalars: torch cannot batch them either
        with pytest.raises(type(exc)):
            default_collate(make())
        return
    assert_same(default_collate(make()), ref)


def test_strings_come_back_as_the_same_list() -> None:
    batch = ["a", "b"]
    assert default_collate(batch) is batch


def test_stacked_arrays_are_contiguous() -> None:
    out = default_collate([np.arange(60.0).reshape(4, 5, 3).transpose(2, 0, 1)] * 2)
    assert out.is_contiguous()


CONVERT_CASES: list[tuple[str, Any]] = [
    ("int", 3),
    ("str", "s"),
    ("np-str", np.str_("s")),
    ("np-array", np.arange(4.0)),
    ("np-scalar", np.float32(2.5)),
    ("np-string-array", np.array(["a", "b"])),
    ("np-object-array", np.array([None, 1], dtype=object)),
    ("tensor", torch.ones(2)),
    ("dict", {"a": np.ones(2), "b": [np.zeros(1), "x"]}),
    ("namedtuple", Point(np.ones(2), 1)),
    ("tuple", (np.ones(2), 1)),
    ("list", [np.ones(2), (np.zeros(2),)]),
    ("mutable-mapping-subclass", TaggedDict(a=np.ones(1))),
    ("immutable-mapping", FrozenMap({"a": np.ones(1)})),
    ("range", range(3)),
    ("custom-sequence", Pair([np.ones(1), 2])),
]


@pytest.mark.parametrize("data", [c[1] for c in CONVERT_CASES], ids=[c[0] for c in CONVERT_CASES])
def test_default_convert_matches_torch(data: Any) -> None:
    assert_same(default_convert(data), torch_convert(data))


# ---------------------------------------------------------------- errors

FAILING_BATCHES: list[tuple[str, Callable[[], Any], type[CollateError]]] = [
    ("missing-key", lambda: [{"a": 1, "b": 2}, {"a": 1}], CollateKeyError),
    ("ragged-tensors", lambda: [torch.zeros(2), torch.zeros(3)], CollateShapeError),
    ("ragged-arrays", lambda: [np.zeros(2), np.zeros(3)], CollateShapeError),
    ("unequal-lists", lambda: [[1, 2], [1]], CollateShapeError),
    ("none-sample", lambda: [{"a": 1}, None], CollateTypeError),
    ("none-in-ints", lambda: [1, None], CollateTypeError),
    ("none-in-floats", lambda: [1.0, None], CollateTypeError),
    ("str-in-ints", lambda: [1, "a"], CollateTypeError),
    ("none-in-tensors", lambda: [torch.zeros(2), None], CollateTypeError),
    ("none-in-arrays", lambda: [np.zeros(2), None], CollateTypeError),
    ("array-in-tensors", lambda: [torch.zeros(2), np.zeros(2)], CollateTypeError),
    ("none-in-lists", lambda: [[1], None], CollateTypeError),
    ("none-in-namedtuples", lambda: [Point(1, 2), None], CollateTypeError),
    ("all-none", lambda: [None, None], CollateTypeError),
    ("object", lambda: [object(), object()], CollateTypeError),
    ("string-arrays", lambda: [np.array(["a"]), np.array(["b"])], CollateTypeError),
    ("object-arrays", lambda: [np.array([None]), np.array([None])], CollateTypeError),
    ("sparse", lambda: [torch.zeros(2).to_sparse()] * 2, CollateTypeError),
]


@pytest.mark.parametrize(
    ("make", "cls"),
    [(c[1], c[2]) for c in FAILING_BATCHES],
    ids=[c[0] for c in FAILING_BATCHES],
)
def test_errors_keep_the_type_torch_raises(make: Callable[[], Any], cls: type) -> None:
    with pytest.raises(Exception) as torch_error:
        _reference(torch_collate, make())
    with pytest.raises(cls) as ours:
        default_collate(make())
    assert isinstance(ours.value, type(torch_error.value))
    assert isinstance(ours.value, CollateError)
    restored = pickle.loads(pickle.dumps(ours.value))
    assert type(restored) is type(ours.value)
    assert str(restored) == str(ours.value)
    assert restored.path == ours.value.path


def _dicts_missing_b(n: int, missing: Sequence[int]) -> list[dict[str, Any]]:
    batch: list[dict[str, Any]] = [{"a": i, "b": {"x": np.ones(2)}} for i in range(n)]
    for i in missing:
        del batch[i]["b"]
    return batch


def test_missing_key_names_positions_and_key_sets() -> None:
    with pytest.raises(KeyError) as info:
        default_collate(_dicts_missing_b(32, [3, 9]))
    err = info.value
    assert isinstance(err, CollateKeyError)
    msg = str(err)
    assert "Key 'b' is missing in 2 of 32 samples" in msg
    assert "batch positions 3, 9" in msg
    assert "{'a', 'b'} in 30 samples" in msg
    assert "{'a'} in 2 samples" in msg
    assert "Fix:" in msg
    assert err.indices == ()


def test_missing_key_with_dataset_indices() -> None:
    with collate_context(range(100, 132)), pytest.raises(CollateKeyError) as info:
        default_collate(_dicts_missing_b(32, [3, 9]))
    assert "dataset indices 103, 109 (batch positions 3, 9)" in str(info.value)
    assert info.value.indices == tuple(range(100, 132))


def test_collate_context_is_reset_afterwards() -> None:
    with collate_context([7, 8]):
        pass
    with pytest.raises(CollateKeyError) as info:
        default_collate([{"a": 1}, {}])
    assert "dataset" not in str(info.value)


def test_nested_missing_key_has_a_path() -> None:
    batch = [{"meta": {"id": 1, "label": 2}}, {"meta": {"id": 2}}]
    with pytest.raises(CollateKeyError) as info:
        default_collate(batch)
    assert info.value.path == "['meta']"
    assert "Key 'label' is missing at ['meta'] in 1 of 2 samples: batch position 1" in str(
        info.value
    )


def test_ragged_tensors_list_shapes_and_indices() -> None:
    batch = [{"image": torch.zeros(3, 8 + (i == 2), 8)} for i in range(4)]
    with collate_context([10, 11, 12, 13]), pytest.raises(RuntimeError) as info:
        default_collate(batch)
    err = info.value
    assert isinstance(err, CollateShapeError)
    assert err.path == "['image']"
    msg = str(err)
    assert msg.startswith("Cannot stack the arrays at ['image']: they have different shapes.")
    assert "(3, 8, 8) at dataset indices 10, 11, 13 (batch positions 0, 1, 3)" in msg
    assert "(3, 9, 8) at dataset index 12 (batch position 2)" in msg
    assert "pad" in msg


def test_ragged_arrays_in_namedtuple_field() -> None:
    batch = [Point(np.zeros(i + 1), i) for i in range(3)]
    with pytest.raises(CollateShapeError) as info:
        default_collate(batch)
    assert info.value.path == ".x"
    assert "(1,) at batch position 0" in str(info.value)


def test_ragged_message_is_abbreviated_for_big_batches() -> None:
    batch = [np.zeros(i) for i in range(300)]
    with pytest.raises(CollateShapeError) as info:
        default_collate(batch)
    msg = str(info.value)
    assert "... and " in msg
    assert len(msg) < 1500


def test_unequal_lengths_keep_torch_message() -> None:
    batch = [{"tok": [1, 2, 3]}, {"tok": [1, 2]}, {"tok": [4, 5, 6]}]
    with pytest.raises(RuntimeError) as info:
        default_collate(batch)
    msg = str(info.value)
    assert isinstance(info.value, CollateShapeError)
    assert "each element in list of batch should be of equal size" in msg
    assert "at ['tok']" in msg
    assert "3 at batch positions 0, 2; 2 at batch position 1" in msg


def test_none_sample_names_position_and_type() -> None:
    with collate_context(["x", "y", "z"]), pytest.raises(TypeError) as info:
        default_collate([{"a": 1}, {"a": 2}, None])
    msg = str(info.value)
    assert isinstance(info.value, CollateTypeError)
    assert "NoneType at dataset index 'z' (batch position 2)" in msg
    assert "dict at dataset indices 'x', 'y'" in msg


def test_mixed_types_keep_torch_runtime_error_and_are_type_errors() -> None:
    batch = [{"meta": (1, 2)}, {"meta": (3, None)}]
    with pytest.raises(RuntimeError) as info:  # torch: "Could not infer dtype of NoneType"
        default_collate(batch)
    assert isinstance(info.value, CollateTypeError)
    assert isinstance(info.value, TypeError)
    assert info.value.path == "['meta'][1]"
    assert "NoneType at batch position 1" in str(info.value)


def test_unsupported_type_is_named() -> None:
    class Blob:
        pass

    with pytest.raises(CollateTypeError) as info:
        default_collate([{"blob": Blob()}, {"blob": Blob()}])
    msg = str(info.value)
    assert "Cannot batch values of type" in msg and "Blob at ['blob']" in msg
    assert "default_collate: batch must contain tensors" in msg


def test_all_none_field() -> None:
    with pytest.raises(CollateTypeError) as info:
        default_collate([{"y": None}, {"y": None}])
    assert str(info.value).startswith("Cannot batch None at ['y'] (batch positions 0, 1).")


def test_string_arrays_name_the_dtype() -> None:
    with pytest.raises(TypeError) as info:
        default_collate([{"name": np.array(["ab"])}] * 2)
    assert "dtype <U2 at ['name']" in str(info.value)


def test_other_errors_keep_type_and_get_a_note() -> None:
    batch = [{"x": np.zeros(2, ">f4")}] * 2  # torch cannot convert non-native byte order
    with collate_context([4, 5]), pytest.raises(ValueError) as info:
        default_collate(batch)
    assert not isinstance(info.value, CollateError)
    notes = getattr(info.value, "__notes__", [])
    assert any("at ['x']" in n and "[4, 5]" in n for n in notes)


def test_empty_batch_is_an_index_error() -> None:
    with pytest.raises(IndexError, match="empty batch"):
        default_collate([])


# ---------------------------------------------------------------- numpy_collate


def _no_tensors(obj: Any) -> None:
    assert not isinstance(obj, torch.Tensor)
    if isinstance(obj, Mapping):
        for v in obj.values():
            _no_tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _no_tensors(v)


def test_numpy_collate_leaves_are_numpy() -> None:
    batch = [
        {
            "img": np.full((2, 2), i, np.uint8),
            "t": torch.ones(3, requires_grad=True) * i,
            "i": i,
            "f": i / 2,
            "b": bool(i),
            "s": np.float32(i),
            "name": f"n{i}",
            "pair": (i, "x"),
            "p": Point(np.zeros(1), i),
        }
        for i in range(4)
    ]
    out = numpy_collate(batch)
    _no_tensors(out)
    assert out["img"].dtype == np.uint8 and out["img"].shape == (4, 2, 2)
    assert out["t"].dtype == np.float32 and out["t"].shape == (4, 3)
    assert out["i"].dtype == np.int64 and out["i"].tolist() == [0, 1, 2, 3]
    assert out["f"].dtype == np.float64
    assert out["b"].dtype == np.bool_
    assert out["s"].dtype == np.float32
    assert out["name"] == ["n0", "n1", "n2", "n3"]
    assert isinstance(out["pair"], list) and out["pair"][1] == ("x",) * 4
    assert isinstance(out["p"], Point) and out["p"].x.shape == (4, 1)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_collate_keeps_array_and_scalar_dtypes(dtype: str) -> None:
    arrays = numpy_collate([np.zeros((2,), dtype)] * 3)
    scalars = numpy_collate([np.dtype(dtype).type(1)] * 3)
    assert arrays.dtype == np.dtype(dtype) and arrays.shape == (3, 2)
    assert scalars.dtype == np.dtype(dtype) and scalars.shape == (3,)


def test_numpy_collate_matches_default_collate_values() -> None:
    make = dict(COLLATE_CASES)["dict-of-arrays"]
    ours = numpy_collate(make())
    ref = default_collate(make())
    for key in ref:
        np.testing.assert_array_equal(ours[key], ref[key].numpy())


@pytest.mark.parametrize(
    ("batch", "cls"),
    [
        ([np.zeros(2), np.zeros(3)], CollateShapeError),
        ([{"a": 1}, {"b": 1}], CollateKeyError),
        ([np.array(["a"])] * 2, CollateTypeError),
        ([1, None], CollateTypeError),
        ([1.0, "x"], CollateTypeError),
        ([[1, 2], [3]], CollateShapeError),
    ],
)
def test_numpy_collate_errors(batch: Any, cls: type) -> None:
    with pytest.raises(cls):
        numpy_collate(batch)


# ---------------------------------------------------------------- output allocator


class SlabAllocator:
    """Hands out 64-byte-aligned slices of one preallocated buffer."""

    def __init__(self, size: int = 1 << 20) -> None:
        self.buffer = np.zeros(size, np.uint8)
        self.offset = 0
        self.requests: list[int] = []

    def __call__(self, nbytes: int) -> np.ndarray | None:
        self.requests.append(nbytes)
        start = -(-self.offset // 64) * 64
        if start + nbytes > self.buffer.size:
            return None
        self.offset = start + nbytes
        return self.buffer[start : start + nbytes]

    def holds(self, t: Any) -> bool:
        lo = self.buffer.ctypes.data
        return lo <= t.data_ptr() < lo + self.buffer.size


@contextlib.contextmanager
def allocator(alloc: Any) -> Iterator[Any]:
    token = OUTPUT_ALLOCATOR.set(alloc)
    try:
        yield alloc
    finally:
        OUTPUT_ALLOCATOR.reset(token)


def _allocator_batch() -> list[dict[str, Any]]:
    return [
        {
            **{f"a_{d}": (np.arange(6).reshape(2, 3) + i).astype(d) for d in NUMPY_DTYPES},
            "t_f32": torch.arange(4.0) * i,
            "t_i16": torch.arange(4, dtype=torch.int16) + i,
            "t_bool": torch.tensor([True, bool(i % 2)]),
            "t_0dim": torch.tensor(i),
            "n": i,
        }
        for i in range(5)
    ]


def test_default_collate_stacks_into_allocator_memory() -> None:
    expected = default_collate(_allocator_batch())
    with allocator(SlabAllocator()) as slab:
        out = default_collate(_allocator_batch())
    assert_same(out, expected)
    for key, value in out.items():
        if key != "n":
            assert slab.holds(value), key
    assert not slab.holds(out["n"])
    assert OUTPUT_ALLOCATOR.get() is None


def test_numpy_collate_stacks_into_allocator_memory() -> None:
    batch = _allocator_batch()
    expected = numpy_collate(batch)
    with allocator(SlabAllocator()) as slab:
        out = numpy_collate(batch)
    for key, value in out.items():
        np.testing.assert_array_equal(value, expected[key])
        assert value.dtype == expected[key].dtype
        assert np.shares_memory(value, slab.buffer) == (key != "n"), key


@pytest.mark.parametrize(
    "batch",
    [
        [torch.ones(3, dtype=torch.bfloat16)] * 2,
        [torch.ones(3, requires_grad=True)] * 2,
        [torch.ones(2), torch.ones(2, dtype=torch.float64)],
        [np.zeros(0, np.float32)] * 2,
    ],
    ids=["bfloat16", "requires-grad", "mixed-dtypes", "empty"],
)
def test_allocator_is_skipped_where_it_cannot_be_used(batch: Any) -> None:
    with allocator(SlabAllocator()) as slab:
        out = default_collate(batch)
    assert slab.requests == []
    assert_same(out, torch_collate(batch))


def test_big_endian_arrays() -> None:
    batch = [np.arange(2, dtype=">f4"), np.arange(2, dtype=">f4")]
    with allocator(SlabAllocator()) as slab, pytest.raises(ValueError, match="byte order"):
        default_collate(batch)  # like torch
    assert slab.requests == []
    with allocator(SlabAllocator()) as slab:
        out = numpy_collate(batch)
    assert out.dtype == np.dtype(">f4") and out.tolist() == [[0, 1], [0, 1]]
    assert np.shares_memory(out, slab.buffer)


def test_allocator_returning_none_falls_back() -> None:
    batch = [np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)]
    with allocator(lambda nbytes: None):
        out = default_collate(batch)
    assert_same(out, torch_collate(batch))


def test_allocator_not_called_for_ragged_batch() -> None:
    with allocator(SlabAllocator()) as slab, pytest.raises(CollateShapeError):
        default_collate([torch.zeros(2), torch.zeros(3)])
    assert slab.requests == []


def test_allocator_returning_wrong_buffer_is_an_error() -> None:
    with allocator(lambda nbytes: np.zeros(nbytes, np.float32)), pytest.raises(ValueError):
        default_collate([np.ones(2), np.ones(2)])


# ---------------------------------------------------------------- without torch


def test_default_collate_without_torch_returns_numpy() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        import numpy as np
        from collections import namedtuple
        from conveyor.collate import default_collate, default_convert
        from conveyor.errors import CollateShapeError

        P = namedtuple("P", "x y")
        batch = [{"a": np.full(2, i, np.float32), "b": i, "c": "s", "p": P(1.5, (i,))}
                 for i in range(3)]
        out = default_collate(batch)
        assert type(out["a"]) is np.ndarray and out["a"].shape == (3, 2), out
        assert out["a"].dtype == np.float32
        assert out["b"].dtype == np.int64 and out["b"].tolist() == [0, 1, 2]
        assert out["c"] == ["s", "s", "s"]
        assert isinstance(out["p"], P) and out["p"].x.dtype == np.float64
        assert isinstance(out["p"].y, list) and out["p"].y[0].tolist() == [0, 1, 2]
        converted = default_convert((np.ones(1, np.float32), np.float32(2.5), "s"))
        assert type(converted) is list, converted  # a plain tuple becomes a list, as in torch
        assert type(converted[0]) is np.ndarray and converted[0].dtype == np.float32
        assert converted[0].tolist() == [1.0] and converted[1:] == [np.float32(2.5), "s"]
        try:
            default_collate([np.zeros(2), np.zeros(3)])
        except CollateShapeError as e:
            assert "different shapes" in str(e)
        else:
            raise AssertionError("no error")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_ragged_first_dimensions_that_add_up_are_still_an_error():
    """(2,3), (1,3), (3,3) hold as many rows as three (2,3) arrays: still ragged."""
    from conveyor.errors import CollateShapeError

    batch = [np.zeros((2, 3)), np.zeros((1, 3)), np.zeros((3, 3))]
    with pytest.raises(CollateShapeError):
        numpy_collate(batch)
    with pytest.raises(RuntimeError):
        default_collate(batch)
