"""A class the main process sent by value goes back as a reference to its own; a class
that no process can name is explained (where it is, why, where to define it).

In one process: cloudpickle tracks the classes it pickles by value, here as a worker
tracks those it received, so a batch of such a class pickles through the worker's
pickler and unpickles as the very same class, whose attributes are left alone.
"""

from __future__ import annotations

import collections
import pickle
from typing import Any

import cloudpickle
import pytest

from conveyor._task.rebuild import rebuild
from conveyor._transport import codec
from conveyor._workers.remote_error import capture
from conveyor.diagnostics.pickling import explain_unpicklable_sample


def _local_point_class() -> Any:
    return collections.namedtuple("Point", "x y")  # not importable: made in a function


class _Described:
    def describe(self) -> str:
        return "described"


def _local_error_class() -> type[Exception]:
    class LocalError(Exception):
        def describe(self) -> str:
            return "local"

    return LocalError


def test_a_class_sent_by_value_pickles_back_as_the_same_class() -> None:
    point = _local_point_class()
    with pytest.raises((pickle.PicklingError, AttributeError)):
        codec.dumps([point(1, 2)])  # never sent: pickle cannot name it
    cloudpickle.dumps(point)  # sent by value, as the dataset carries it to a worker

    batch = pickle.loads(codec.dumps([point(1, 2), point(3, 4)]))

    assert [type(p) for p in batch] == [point, point]
    assert batch == [(1, 2), (3, 4)]


def test_an_exception_of_a_class_sent_by_value_comes_back_untouched() -> None:
    error_class = _local_error_class()
    describe = error_class.describe
    cloudpickle.dumps(error_class)

    rebuilt = rebuild(capture(error_class("bad sample 3")))

    assert type(rebuilt) is error_class
    assert rebuilt.args == ("bad sample 3",)
    # Pickled by value, cloudpickle would have re-set the class's methods with copies.
    assert error_class.describe is describe


def test_plain_batches_do_not_look_classes_up() -> None:
    # Importable classes pickle by name as before, whatever cloudpickle tracks.
    cloudpickle.dumps(_local_point_class())
    data = codec.dumps({"x": _Described(), "kind": _Described})
    assert b"_Described" in data
    assert type(pickle.loads(data)["x"]) is _Described


def test_a_class_no_process_can_name_is_explained() -> None:
    point = _local_point_class()
    sample = {"p": point(1, 2)}
    with pytest.raises((pickle.PicklingError, AttributeError)) as info:
        codec.dumps(sample)

    error = explain_unpicklable_sample(sample, info.value, indices=[5])

    assert error.path == "sample['p'].__class__"
    message = str(error)
    assert message.startswith(
        "A worker cannot send a sample back (dataset index 5): sample['p'].__class__ is the "
        f"class {__name__}.Point, which the main process cannot find by its module and name ("
    )
    assert message.endswith(
        f"Fix: define {__name__}.Point at the top level of a module or of the training "
        "script, not inside a function nor only in the worker, so that the main process "
        "finds it by its module and name (a class of the script's own comes back as that "
        "class)."
    )
