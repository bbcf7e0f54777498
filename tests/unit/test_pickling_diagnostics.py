"""find_unpicklable names the deepest unpicklable parts; explain_unpicklable adds the fix."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import cloudpickle
import pytest

from conveyor.diagnostics.pickling import (
    PicklingFinding,
    explain_unpicklable,
    explain_unpicklable_sample,
    find_unpicklable,
)
from conveyor.diagnostics.walk import Walk
from conveyor.errors import UnpicklableError


def _pickle5(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _where(obj: Any, root: str = "dataset", **kwargs: Any) -> list[tuple[str, str]]:
    return [(f.path, f.type_name) for f in find_unpicklable(obj, root, **kwargs)]


@pytest.fixture
def binary_file(tmp_path: Path) -> Iterator[BinaryIO]:
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x00" * 16)
    with path.open("rb") as fh:
        yield fh


@pytest.fixture
def text_file(tmp_path: Path) -> Iterator[TextIO]:
    path = tmp_path / "data.txt"
    path.write_text("hello\n")
    with path.open() as fh:
        yield fh


@pytest.fixture
def connection() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:")
    yield conn
    conn.close()


class Holder:
    """A plain object whose attributes the tests fill in."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


# -- what pickles finds nothing ------------------------------------------------------------


def test_picklable_dataset_has_no_finding() -> None:
    assert find_unpicklable(Holder(values=[1, 2.0, "x"], table={"a": (1, 2)})) == []


def test_lambda_is_fine_under_cloudpickle() -> None:
    dataset = Holder(transform=lambda x: x + 1)
    assert find_unpicklable(dataset) == []
    assert find_unpicklable(lambda x: x, "collate_fn") == []


def test_large_picklable_dataset_costs_one_dumps() -> None:
    calls: list[int] = []

    def counting_dumps(obj: Any) -> bytes:
        calls.append(1)
        return cloudpickle.dumps(obj)

    dataset = Holder(names=[f"sample-{i}.jpg" for i in range(1_000_000)])
    assert find_unpicklable(dataset, dumps=counting_dumps) == []
    assert len(calls) == 1


# -- real offenders, exact paths and types -------------------------------------------------


def test_open_file_attribute(binary_file: BinaryIO) -> None:
    [finding] = find_unpicklable(Holder(root="/data", fh=binary_file))
    assert (finding.path, finding.type_name) == ("dataset.fh", "_io.BufferedReader")
    assert "BufferedReader" in finding.reason  # the error's words, as this Python puts them


def test_sqlite_connection_two_levels_down(connection: sqlite3.Connection) -> None:
    dataset = Holder(size=3, db=Holder(path=":memory:", connection=connection))
    assert _where(dataset) == [("dataset.db.connection", "sqlite3.Connection")]


def test_generator_in_a_list() -> None:
    dataset = Holder(sources=["a.csv", (line for line in ["x"]), "c.csv"])
    assert _where(dataset) == [("dataset.sources[1]", "builtins.generator")]


def test_lock_in_a_dict_in_an_object() -> None:
    dataset = Holder(state=Holder(cache={"hits": 0, "lock": threading.Lock()}))
    assert _where(dataset) == [("dataset.state.cache['lock']", "_thread.lock")]


def test_closure_capturing_a_file(binary_file: BinaryIO) -> None:
    def make_collate() -> Callable[[list[Any]], bytes]:
        fh = binary_file

        def collate_fn(batch: list[Any]) -> bytes:
            return fh.read()

        return collate_fn

    assert _where(make_collate(), "collate_fn") == [
        ("collate_fn.<closure var 'fh'>", "_io.BufferedReader")
    ]


def test_global_of_a_function_pickled_by_value(connection: sqlite3.Connection) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "conn": connection}
    exec("def collate_fn(batch):\n    return [conn.execute(q) for q in batch]\n", namespace)
    assert _where(namespace["collate_fn"], "collate_fn") == [
        ("collate_fn.<global 'conn'>", "sqlite3.Connection")
    ]


def test_getstate_result(binary_file: BinaryIO) -> None:
    class Custom:
        def __getstate__(self) -> dict[str, Any]:
            return {"name": "x", "handle": binary_file}

    assert _where(Holder(inner=Custom())) == [
        ("dataset.inner.__getstate__()['handle']", "_io.BufferedReader")
    ]


def test_reduce_result() -> None:
    lock = threading.Lock()

    class Custom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Holder, (), {"lock": lock})

    assert _where(Custom()) == [("dataset.__reduce__()[2]['lock']", "_thread.lock")]


def test_slots() -> None:
    class Slotted:
        __slots__ = ("lock", "name")

        def __init__(self) -> None:
            self.name = "x"
            self.lock = threading.RLock()

    assert _where(Slotted()) == [("dataset.lock", "_thread.RLock")]


def test_dataclass_field() -> None:
    @dataclasses.dataclass
    class Config:
        host: str
        sock: socket.socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert _where(Holder(config=Config("localhost", sock))) == [
            ("dataset.config.sock", "socket.socket")
        ]


def test_partial_arguments(binary_file: BinaryIO) -> None:
    collate = functools.partial(sorted, key=binary_file)
    assert _where(collate, "collate_fn") == [("collate_fn.keywords['key']", "_io.BufferedReader")]
    collate = functools.partial(print, 1, binary_file)
    assert _where(collate, "collate_fn") == [("collate_fn.args[1]", "_io.BufferedReader")]


def test_bound_method(connection: sqlite3.Connection) -> None:
    class Collator:
        def __init__(self) -> None:
            self.conn = connection

        def __call__(self, batch: list[Any]) -> list[Any]:
            return batch

    assert _where(Collator().__call__, "collate_fn") == [
        ("collate_fn.__self__.conn", "sqlite3.Connection")
    ]


def test_class_attribute_of_a_class_pickled_by_value() -> None:
    class LocalDataset:
        cache_lock = threading.Lock()

    assert _where(LocalDataset()) == [("dataset.__class__.cache_lock", "_thread.lock")]


# -- graph shapes --------------------------------------------------------------------------


def test_cycle_back_to_the_root_is_not_blamed() -> None:
    dataset = Holder(lock=threading.Lock())
    dataset.children = [Holder(parent=dataset), Holder(parent=dataset)]
    dataset.me = dataset
    assert _where(dataset) == [("dataset.lock", "_thread.lock")]


def test_self_containing_list() -> None:
    items: list[Any] = [1]
    items.append(items)
    items.append(threading.Lock())
    assert _where(items, "sample") == [("sample[2]", "_thread.lock")]


def test_shared_offender_is_reported_once() -> None:
    shared = Holder(lock=threading.Lock())
    assert _where(Holder(a=shared, b=shared)) == [("dataset.a.lock", "_thread.lock")]


def test_every_offender_up_to_max_findings() -> None:
    dataset = Holder(locks=[threading.Lock() for _ in range(10)], gen=(i for i in range(0)))
    assert _where(dataset) == [(f"dataset.locks[{i}]", "_thread.lock") for i in range(5)]
    assert len(find_unpicklable(dataset, max_findings=2)) == 2
    assert _where(Holder(a=threading.Lock(), b=(i for i in range(0)))) == [
        ("dataset.a", "_thread.lock"),
        ("dataset.b", "builtins.generator"),
    ]


def test_failing_item_at_the_end_of_a_large_list_is_found_by_bisection() -> None:
    calls: list[int] = []

    def counting_dumps(obj: Any) -> bytes:
        calls.append(1)
        return cloudpickle.dumps(obj)

    names: list[Any] = [f"sample-{i}.jpg" for i in range(1_000_000)]
    names[-1] = threading.Lock()
    assert _where(Holder(names=names), dumps=counting_dumps) == [
        ("dataset.names[999999]", "_thread.lock")
    ]
    assert len(calls) < 100  # about two per halving, not one per item


def test_large_dict_values_and_keys() -> None:
    table: dict[Any, Any] = {f"k{i}": i for i in range(10_000)}
    table["k5000"] = threading.Lock()
    assert _where(table, "sample") == [("sample['k5000']", "_thread.lock")]


# -- the walker never raises ---------------------------------------------------------------


def test_hostile_getattribute_blames_the_object_and_does_not_raise() -> None:
    class Hostile:
        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError(f"no {name}")

    dataset = Holder(ok=1, proxy=Hostile(), lock=threading.Lock())
    findings = find_unpicklable(dataset)
    assert [(f.path, f.type_name.rpartition(".")[2]) for f in findings] == [
        ("dataset.proxy", "Hostile"),
        ("dataset.lock", "lock"),
    ]
    assert findings[0].reason.startswith("no __")


def test_raising_property_and_reduce_do_not_escape() -> None:
    class Raising:
        @property
        def broken(self) -> int:
            raise ValueError("property")

        def __reduce_ex__(self, protocol: Any) -> Any:
            raise ValueError("refuses to be pickled")

    findings = find_unpicklable({"x": Raising()}, "sample")
    assert [(f.path, f.reason) for f in findings] == [("sample['x']", "refuses to be pickled")]


# -- plain pickle (samples) ----------------------------------------------------------------


def test_under_plain_pickle_a_lambda_is_the_culprit() -> None:
    assert _where({"fn": lambda: 1}, "sample", dumps=_pickle5) == [
        ("sample['fn']", "builtins.function")
    ]


def test_under_plain_pickle_a_local_class_is_the_culprit() -> None:
    class Local:
        pass

    assert _where({"x": Local()}, "sample", dumps=_pickle5) == [
        ("sample['x'].__class__", "builtins.type")
    ]


def test_under_plain_pickle_a_text_file_in_a_sample(text_file: TextIO) -> None:
    sample = {"image": b"...", "meta": {"id": 3, "fh": text_file}}
    assert _where(sample, "sample", dumps=_pickle5) == [
        ("sample['meta']['fh']", "_io.TextIOWrapper")
    ]


# -- explaining ----------------------------------------------------------------------------


def test_explain_dataset_says_what_where_why_fix(connection: sqlite3.Connection) -> None:
    dataset = Holder(db=Holder(connection=connection))
    try:
        cloudpickle.dumps(dataset)
    except TypeError as exc:
        error = explain_unpicklable(dataset, "dataset", exc, role="dataset", start_method="spawn")
    assert isinstance(error, UnpicklableError)
    assert isinstance(error, TypeError) and isinstance(error, pickle.PicklingError)
    assert error.path == "dataset.db.connection"
    assert error.type_name == "sqlite3.Connection"
    assert str(error) == (
        "Cannot send the dataset to worker processes (start method 'spawn'): "
        "dataset.db.connection is a sqlite3.Connection, which cannot be pickled. Fix: store "
        "conveyor.per_worker(<function that opens it>, <its arguments>) instead, e.g. "
        "conveyor.per_worker(sqlite3.connect, path): it connects lazily, once in each "
        "worker, and pickles as the recipe."
    )
    # Not "or use fork": forked workers would share the connection (see the pre-flight).
    assert "multiprocessing_context" not in str(error)


@pytest.mark.parametrize(
    "refusal",
    [
        "cannot pickle '_io.TextIOWrapper' object",  # Python 3.11
        "cannot pickle 'TextIOWrapper' instances",  # Python 3.12
    ],
)
def test_a_plain_refusal_is_said_in_conveyors_words_whatever_pythons(refusal: str) -> None:
    found = PicklingFinding("dataset.fh", "_io.TextIOWrapper", refusal)
    assert found.why() == "dataset.fh is a _io.TextIOWrapper, which cannot be pickled."


def test_a_reason_of_the_users_own_is_kept() -> None:
    class Session:
        def __reduce__(self) -> Any:
            raise TypeError("log in again in each worker")

    [found] = find_unpicklable(Holder(session=Session()))
    assert found.why().endswith("which cannot be pickled (log in again in each worker).")


def test_explain_fix_depends_on_the_type(binary_file: BinaryIO) -> None:
    message = str(
        explain_unpicklable(
            Holder(fh=binary_file, gen=(i for i in range(0))),
            "dataset",
            TypeError("x"),
            role="dataset",
            start_method="fork",
        )
    )
    assert "dataset.fh is a _io.BufferedReader" in message
    assert "Also: dataset.gen (builtins.generator)." in message
    assert f"store conveyor.per_worker(open, {binary_file.name!r}, 'rb') in dataset.fh" in message
    assert "create it where it is consumed (in __iter__ or __getitem__)" in message
    assert "multiprocessing_context" not in message
    binary_file.close()  # no longer a handle that can be opened again: the fix for its type
    closed = explain_unpicklable(Holder(fh=binary_file), "dataset", TypeError("x"), role="dataset")
    assert "store conveyor.per_worker(open, path) instead" in str(closed)


def test_explain_collate_fn_closure(binary_file: BinaryIO) -> None:
    def collate_fn(batch: list[Any]) -> bytes:
        return binary_file.read()

    error = explain_unpicklable(
        collate_fn, "collate_fn", TypeError("x"), role="collate_fn", start_method="forkserver"
    )
    assert error.path == "collate_fn.<closure var 'binary_file'>"
    assert str(error).startswith(
        "Cannot send the collate_fn to worker processes (start method 'forkserver'): "
        "collate_fn.<closure var 'binary_file'> is a _io.BufferedReader"
    )


def test_explain_without_a_finding_falls_back_to_the_error() -> None:
    error = explain_unpicklable([1, 2], "sampler", ValueError("boom\ndetails"), role="sampler")
    assert error.path == "sampler"
    assert error.type_name == "builtins.list"
    assert "sampler cannot be pickled (boom)." in str(error)


def test_explain_sample(text_file: TextIO) -> None:
    sample = {"meta": {"fh": text_file}}
    with pytest.raises(TypeError) as info:
        pickle.dumps(sample, protocol=5)
    error = explain_unpicklable_sample(sample, info.value, indices=[7], worker_id=2)
    assert (error.path, error.type_name) == ("sample['meta']['fh']", "_io.TextIOWrapper")
    assert str(error) == (
        "A worker cannot send a sample back (dataset index 7, worker 2): "
        "sample['meta']['fh'] is a _io.TextIOWrapper, which cannot be pickled. Fix: return "
        "plain data "
        "(arrays, numbers, strings) from __getitem__; open resources inside it "
        "and close them before returning."
    )
    batch_error = explain_unpicklable_sample(sample, info.value, indices=[3, 4])
    assert "(dataset indices [3, 4])" in str(batch_error)


def test_explained_error_survives_pickling(connection: sqlite3.Connection) -> None:
    error = explain_unpicklable(Holder(conn=connection), "dataset", TypeError("x"), role="dataset")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.path, copy.type_name, str(copy)) == (
        UnpicklableError,
        "dataset.conn",
        "sqlite3.Connection",
        str(error),
    )


def test_explain_suggests_fork_only_for_what_fork_can_share() -> None:
    lock_holder = Holder(lock=threading.Lock())
    message = str(
        explain_unpicklable(
            lock_holder, "dataset", TypeError("x"), role="dataset", start_method="spawn"
        )
    )
    assert "dataset.lock" in message
    assert message.endswith("or use multiprocessing_context='fork'.")


# -- one path grammar, one recipe ----------------------------------------------------------


def _shapes(fh: BinaryIO) -> list[tuple[str, Any, str]]:
    """(root, object, the path of ``fh`` in it): each way a handle can be held."""

    class Slotted:
        __slots__ = ("fh",)

        def __init__(self) -> None:
            self.fh = fh

    def collate_default(batch: Any, fh: BinaryIO = fh) -> Any:
        return batch

    def collate_kwonly(batch: Any, *, out: BinaryIO = fh) -> Any:
        return batch

    def make_init() -> Callable[[int], None]:
        handle = fh

        def worker_init_fn(worker_id: int) -> None:
            handle.seek(0)

        return worker_init_fn

    return [
        ("dataset", Holder(db=Holder(fh=fh)), "dataset.db.fh"),
        ("dataset", Holder(table={"meta": [1, fh]}), "dataset.table['meta'][1]"),
        ("dataset", Holder(s=Slotted()), "dataset.s.fh"),
        ("collate_fn", collate_default, "collate_fn.<default 'fh'>"),
        ("collate_fn", collate_kwonly, "collate_fn.<default 'out'>"),
        ("collate_fn", functools.partial(sorted, key=fh), "collate_fn.keywords['key']"),
        ("collate_fn", functools.partial(print, 1, fh), "collate_fn.args[1]"),
        ("worker_init_fn", make_init(), "worker_init_fn.<closure var 'handle'>"),
        ("collate_fn", Holder(fh=fh).__init__, "collate_fn.__self__.fh"),
    ]


def test_the_walk_and_the_pickling_search_name_a_part_the_same_way(binary_file: BinaryIO) -> None:
    for root, obj, path in _shapes(binary_file):
        held = [p for p, _ in Walk([(root, obj)]).handles]  # what check() and the pre-flight see
        pickled = [f.path for f in find_unpicklable(obj, root)]  # what UnpicklableError names
        assert held == pickled == [path], (root, obj)


def test_explain_gives_the_precise_recipe_in_every_root(binary_file: BinaryIO) -> None:
    recipe = f"conveyor.per_worker(open, {binary_file.name!r}, 'rb')"
    for root, obj, path in _shapes(binary_file):
        error = explain_unpicklable(obj, root, TypeError("x"), role=root, start_method="spawn")
        assert error.path == path
        assert recipe in str(error), str(error)
        assert "multiprocessing_context" not in str(error)  # fork would share the file
    _, collate_fn, _ = _shapes(binary_file)[3]
    default = explain_unpicklable(collate_fn, "collate_fn", TypeError("x"), role="collate_fn")
    assert f"make {recipe} the default of fh in collate_fn instead" in str(default)
