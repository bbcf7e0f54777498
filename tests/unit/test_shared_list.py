"""conveyor.SharedList: a list kept as one buffer, read without touching shared objects."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
from array import array
from collections.abc import Sequence
from fractions import Fraction

import cloudpickle
import numpy as np
import psutil
import pytest

from conveyor import SharedList
from conveyor.shared_list import _offsets

STRS = ["/data/a.jpg", "", "b", "/data/dir with space/c.png"]
UNICODE = ["é", "日本語/ファイル.jpg", "🙂 emoji", "mixed ascii and ü", "", "\x00nul"]
DICTS = [{"path": f"/d/{i}.jpg", "label": i, "box": (i, i + 1.5)} for i in range(5)]
TUPLES = [(i, f"s{i}", None) for i in range(5)]
MIXED = ["text", 1, 2.5, None, b"bytes", ("t",), {"k": [1, 2]}, Fraction(1, 3), True]


class Tag(str):
    """A str subclass: stored pickled, so that it keeps its type."""


CASES = {"str": STRS, "unicode": UNICODE, "dict": DICTS, "tuple": TUPLES, "mixed": MIXED}


@pytest.fixture(params=list(CASES), ids=list(CASES))
def items(request) -> list:
    return CASES[request.param]


def test_round_trip(items):
    shared = SharedList(items)
    assert len(shared) == len(items)
    assert [shared[i] for i in range(len(items))] == items
    assert list(shared) == items
    assert shared == items and items == shared
    assert [type(x) for x in shared] == [type(x) for x in items]


def test_text_is_stored_as_utf8_everything_else_as_pickles():
    text = SharedList(UNICODE)
    assert text._text and text._buffer == "".join(UNICODE).encode()
    assert not SharedList(MIXED)._text
    assert not SharedList(["a", 1])._text  # one non-str item: all pickled
    surrogate = ["ok", "bad\udcff"]  # undecodable file names keep round-tripping
    assert SharedList(surrogate) == surrogate and not SharedList(surrogate)._text
    tagged = SharedList([Tag("x")])
    assert type(tagged[0]) is Tag  # str subclasses keep their type


def test_empty():
    empty = SharedList()
    assert len(empty) == 0 and list(empty) == [] and empty == []
    assert SharedList([]) == SharedList(iter(()))
    with pytest.raises(IndexError):
        empty[0]
    with pytest.raises(IndexError):
        empty[-1]
    assert empty[:] == [] and repr(empty) == "SharedList([])"
    assert pickle.loads(pickle.dumps(empty)) == []


def test_negative_indices_and_index_errors(items):
    shared = SharedList(items)
    n = len(items)
    for i in range(-n, n):
        assert shared[i] == items[i]
    for bad in (n, n + 10, -n - 1):
        with pytest.raises(IndexError, match="out of range"):
            shared[bad]


def test_integer_like_indices():
    shared = SharedList(STRS)
    assert shared[np.int64(2)] == "b" and shared[np.int32(-1)] == STRS[-1]
    with pytest.raises(TypeError, match="integers or slices, not str"):
        shared["0"]  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        shared[1.0]  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "key",
    [slice(None), slice(1, 3), slice(-2, None), slice(None, -1), slice(3, 1), slice(10, 20),
     slice(None, None, 2), slice(None, None, -1), slice(-1, 0, -2), slice(1, None, 3)],
)  # fmt: skip
def test_slices_are_shared_lists(items, key):
    shared = SharedList(items)
    part = shared[key]
    assert isinstance(part, SharedList)
    assert part == items[key] and list(part) == items[key]
    assert part[::-1] == items[key][::-1]  # a slice is a full SharedList itself


def test_equality():
    assert SharedList(STRS) == SharedList(list(STRS))
    assert SharedList(STRS) != SharedList(STRS[:-1])
    assert SharedList(["a"]) != SharedList(["b"])
    assert SharedList([1, 2]) == SharedList([1.0, 2])  # item equality, not pickle bytes
    assert SharedList([{"a": 1, "b": 2}]) == [{"b": 2, "a": 1}]
    assert SharedList(["a"]) != ["a", "b"]
    assert SharedList(["a"]) != ("a",)  # like a list: never equal to a tuple
    assert SharedList(["a"]) != "a"
    with pytest.raises(TypeError):
        hash(SharedList(["a"]))


def test_sequence_behaviour():
    shared = SharedList(STRS)
    assert isinstance(shared, Sequence)
    assert "b" in shared and "zz" not in shared
    assert shared.index("b") == 2 and shared.count("") == 1
    assert list(reversed(shared)) == STRS[::-1]
    assert SharedList(shared) == STRS  # from another SharedList: shares its buffers
    assert SharedList(shared)._buffer is shared._buffer


def test_reads_build_new_objects():
    shared = SharedList(DICTS)
    first = shared[0]
    first["label"] = "changed"
    assert shared[0] == DICTS[0]


def test_repr():
    assert repr(SharedList(["a", "b"])) == "SharedList(['a', 'b'])"
    long = SharedList(str(i) for i in range(1000))
    assert repr(long) == "SharedList(['0', '1', '2', '3', '4', ...], len=1_000)"


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_pickles_compactly(items, dumps):
    shared = SharedList(items)
    data = dumps(shared)
    again = pickle.loads(data)
    assert isinstance(again, SharedList) and again == items
    assert len(data) < shared.nbytes + 200  # the two buffers and a little framing


def test_pickles_compactly_at_scale():
    paths = [f"/datasets/train/{i:07d}.jpg" for i in range(10_000)]
    shared = SharedList(paths)
    assert shared.nbytes == len("".join(paths)) + 4 * (len(paths) + 1)  # 32-bit offsets
    assert len(pickle.dumps(shared)) < shared.nbytes + 200


def test_unpicklable_items_are_named():
    with pytest.raises(TypeError, match=r"item 1 \(generator\) cannot be pickled"):
        SharedList(["fine", (x for x in ())])


def test_a_million_paths():
    """Builds in about a second (no timing assert: the machine is shared)."""
    n = 1_000_000
    paths = [f"/datasets/imagenet/train/n{i % 1000:08d}/img_{i:08d}.JPEG" for i in range(n)]
    shared = SharedList(paths)
    assert len(shared) == n
    assert shared[0] == paths[0] and shared[-1] == paths[-1] and shared[n // 2] == paths[n // 2]
    assert shared.nbytes == sum(map(len, paths)) + 4 * (n + 1)
    assert shared[1000:1003] == paths[1000:1003]


def test_offsets_widen_past_4_gib():
    assert _offsets([1, 2], 3) == array("I", [0, 1, 3])
    wide = _offsets([2**31, 2**31], 2**32)
    assert wide.typecode == "q" and list(wide) == [0, 2**31, 2**32]


def _uss_growth_reading_all(container, conn) -> None:
    gc.disable()  # measure the reads, not a collection walking the parent's objects
    me = psutil.Process()
    before = me.memory_full_info().uss
    total = 0
    for i in range(len(container)):
        total += len(container[i])
    conn.send((me.memory_full_info().uss - before, total))
    conn.close()


def test_a_forked_child_reading_every_item_copies_nothing():
    """The point of SharedList: reads in a forked child write to no shared page."""
    n = 200_000
    paths = [f"/datasets/train/class_{i % 100:03d}/image_{i:08d}.jpg" for i in range(n)]
    ctx = multiprocessing.get_context("fork")
    growth = {}
    for name, container in (("list", paths), ("SharedList", SharedList(paths))):
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_uss_growth_reading_all, args=(container, send))
        child.start()
        send.close()
        growth[name], total = receive.recv()
        child.join()
        receive.close()
        assert child.exitcode == 0 and total == sum(map(len, paths))
    assert growth["list"] > 8 * 2**20, growth  # ~100 bytes a string, nearly all copied
    # (Reading makes a str per item, freed at once: the child's heap still grows a little,
    # 2.8 MB on Python 3.10 with NumPy 1.24, against 22 MB for the list.)
    assert growth["SharedList"] < growth["list"] / 4, growth


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataset_of_it_in_conveyor_and_torch_workers(method):
    import conveyor

    items = SharedList(f"/d/{i}.jpg" for i in range(40))
    kwargs = dict(batch_size=8, num_workers=2, collate_fn=list, multiprocessing_context=method)
    assert [x for b in conveyor.DataLoader(items, **kwargs) for x in b] == items
    if method == "fork":
        torch_data = pytest.importorskip("torch.utils.data")
        assert [x for b in torch_data.DataLoader(items, **kwargs) for x in b] == items
