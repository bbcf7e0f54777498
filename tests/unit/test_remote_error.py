"""A worker's exception captured and rebuilt in one process: which class comes back.

The real trip, with a training script's own class under every start method, is
``tests/faults/test_worker_errors.py``; here, the rule for a by-value copy.
"""

from __future__ import annotations

import sys
import types

import pytest

from conveyor._task.rebuild import rebuild
from conveyor._workers.remote_error import capture
from conveyor.errors import add_note


def test_a_copy_of_a_class_comes_back_as_the_class_this_process_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = types.ModuleType("a_training_script")
    exec("class CorruptSample(Exception):\n    pass\n", script.__dict__)
    monkeypatch.setitem(sys.modules, script.__name__, script)
    # What a spawn worker holds: the script's class by value, not found by its name there.
    copy = type("CorruptSample", (Exception,), {"__module__": script.__name__})
    error = copy("sample 3 is corrupt")
    add_note(error, "noted in __getitem__")
    error.shard = "shard-7"  # type: ignore[attr-defined]

    exc = rebuild(capture(error))

    assert type(exc) is script.CorruptSample
    assert exc.args == ("sample 3 is corrupt",)
    assert exc.__notes__ == ["noted in __getitem__"]
    assert exc.shard == "shard-7"  # type: ignore[attr-defined]


def test_a_class_named_nowhere_comes_back_as_a_copy() -> None:
    local = type("LocalError", (Exception,), {"__qualname__": "f.<locals>.LocalError"})

    exc = rebuild(capture(local("local 5")))

    assert type(exc).__name__ == "LocalError"
    assert exc.args == ("local 5",)
