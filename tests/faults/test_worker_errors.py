"""User code that fails in a worker: the error reaches the main process intact.

Every case runs under fork, spawn and forkserver (variants whose code path does
not depend on the start method under fork and forkserver only: see ``matrix``);
the autouse ``leak_check`` fixture (conftest.py) then checks that nothing is left
behind. Datasets live at module level so spawn and forkserver workers import them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import DataLoader, IterableDataset, PreflightWarning, UnpicklableError, WorkerError
from conveyor.errors import Culprit
from tests.faults import CHEAP_METHODS, matrix
from tests.helpers import leaks
from tests.helpers.interrupts import CHILD_ENV

pytestmark = pytest.mark.timeout(90)
SCRIPTS = Path(__file__).parent / "scripts"

# --- user code that fails -----------------------------------------------------


class TwoArgError(Exception):
    """``__init__`` needs two arguments, so ``cls(*exc.args)`` cannot rebuild it."""

    def __init__(self, shard: str, offset: int) -> None:
        super().__init__(f"bad record in {shard} at offset {offset}")
        self.shard = shard
        self.offset = offset


def _local_error_class() -> type[Exception]:
    class LocalError(Exception):  # not importable: its qualname has <locals>
        pass

    return LocalError


def _unpicklable_local_error_class() -> type[Exception]:
    class LockedError(Exception):  # not importable, and cloudpickle cannot copy it
        lock = threading.Lock()

    return LockedError


def _raise(kind: str, index: int) -> None:
    if kind == "KeyError":
        raise KeyError(f"missing-{index}")
    if kind == "TwoArgError":
        raise TwoArgError("shard-7", index)
    if kind == "LocalError":
        raise _local_error_class()(f"local {index}")
    if kind == "LockedError":
        raise _unpicklable_local_error_class()(f"locked {index}")
    raise AssertionError(kind)


class FailsAt:
    """Sample ``i`` is ``(i, pid of the worker)``; ``dataset[bad]`` raises ``kind``."""

    def __init__(self, kind: str, bad: int, length: int = 10) -> None:
        self.kind = kind
        self.bad = bad
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, int]:
        if index == self.bad:
            _raise(self.kind, index)
        return index, os.getpid()


def collate_fails_on_3(batch: list[tuple[int, int]]) -> list[int]:
    indices = [i for i, _ in batch]
    if 3 in indices:
        raise ValueError(f"cannot collate {indices}")
    return indices


def init_fails(worker_id: int) -> None:
    raise PermissionError(f"worker {worker_id} (pid {os.getpid()}) cannot open the shards")


class IterFails(IterableDataset):
    """``at_iter``: ``__iter__`` itself raises; ``mid_way``: after yielding three items."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __iter__(self) -> Iterator[int]:
        if self.where == "at_iter":
            raise OSError("shard list unreachable")
        return self._items()

    def _items(self) -> Iterator[int]:
        yield from range(3)
        raise OSError("shard 2 truncated")


class UnsendableAt3:
    """Sample 3 cannot be pickled back to the main process."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> Any:
        if index != 3:
            return index
        if self.what == "file":
            return open(__file__, "rb")  # the point: an open file
        if self.what == "generator":
            return (i for i in range(3))
        return {"index": index, "handle": open(__file__, "rb")}


class HoldsHandle:
    """A dataset that opened its resource in ``__init__`` (the classic mistake)."""

    def __init__(self, what: str) -> None:
        if what == "binary_file":
            self.fh = open(__file__, "rb")  # noqa: SIM115
        else:
            self.db = _Db()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index

    def close(self) -> None:
        if hasattr(self, "fh"):
            self.fh.close()
        else:
            self.db.conn.close()


class _Db:
    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:")


def _loader(dataset: Any, start_method: str, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("num_workers", 1)
    return DataLoader(dataset, multiprocessing_context=start_method, **kwargs)


def _note(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    assert len(notes) == 1, notes
    return notes[0]


# --- __getitem__ --------------------------------------------------------------


@pytest.mark.parametrize(
    ("start_method", "kind", "num_workers"), matrix([("KeyError", 2), ("TwoArgError", 1)])
)
def test_getitem_error_keeps_its_type_and_says_where(
    start_method: str, kind: str, num_workers: int
) -> None:
    # Batches go round-robin: dataset[7] raises in batch 3 = [6, 7], which goes to the
    # worker that made batch 3 % num_workers.
    loader = _loader(FailsAt(kind, bad=7), start_method, batch_size=2, num_workers=num_workers)
    it = iter(loader)
    indices, pids = [], []
    for _ in range(3):
        batch = next(it)
        indices.append(batch[0].tolist())
        pids.append(batch[1].tolist())
    assert indices == [[0, 1], [2, 3], [4, 5]]
    worker = 3 % num_workers
    pid = pids[worker][0]
    expected = KeyError if kind == "KeyError" else TwoArgError

    with pytest.raises(expected) as info:
        next(it)

    exc = info.value
    assert type(exc) is expected
    if kind == "KeyError":
        assert exc.args == ("missing-7",)
    else:
        assert str(exc) == "bad record in shard-7 at offset 7"
        assert (exc.shard, exc.offset) == ("shard-7", 7)
    ctx = exc.conveyor_context
    assert (ctx.worker_id, ctx.pid, ctx.stage, ctx.indices) == (worker, pid, "fetch", (6, 7))
    note = _note(exc)
    assert note.startswith(
        f"Raised in DataLoader worker {worker} (pid {pid}) during fetch of dataset index 7, "
        "in batch 3 (dataset indices [6, 7]).\n"
    )
    assert ctx.culprit == Culprit((7,))
    assert "in __getitem__" in note
    assert "_raise(self.kind, index)" in note
    assert "in __getitem__" in ctx.traceback


@pytest.mark.parametrize("start_method", CHEAP_METHODS)
def test_loader_goes_on_after_a_worker_exception_like_torch(start_method: str) -> None:
    loader = _loader(FailsAt("KeyError", bad=5, length=8), start_method, batch_size=2)
    outcomes: list[Any] = []
    it = iter(loader)
    while True:
        try:
            outcomes.append(next(it)[0].tolist())
        except StopIteration:
            break
        except KeyError as exc:
            outcomes.append(exc.conveyor_context.indices)
    # torch.utils.data.DataLoader (2.13) gives [[0, 1], [2, 3], KeyError, [6, 7]].
    assert outcomes == [[0, 1], [2, 3], (4, 5), [6, 7]]


def test_exception_class_defined_in_a_function_arrives_by_value(start_method: str) -> None:
    loader = _loader(FailsAt("LocalError", bad=1), start_method, batch_size=2)

    with pytest.raises(Exception) as info:  # its class exists only in the worker
        next(iter(loader))

    exc = info.value
    assert str(exc) == "local 1"
    assert type(exc).__name__ == "LocalError"
    assert type(exc).__module__ == __name__
    assert exc.args == ("local 1",)
    assert exc.conveyor_context.stage == "fetch"
    assert exc.conveyor_context.indices == (0, 1)
    assert "raise _local_error_class()" in _note(exc)


def test_exception_class_of_the_main_script_is_caught_by_its_name(start_method: str) -> None:
    # The script defines CorruptSample at top level, as a training script does; its
    # workers raise it, and a class defined in a function there. torch gives the same.
    child = subprocess.run(
        [sys.executable, str(SCRIPTS / "main_exception.py"), start_method],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    first, corrupt, local = json.loads(child.stdout)

    assert first == [0, 1]
    assert corrupt["type"] == "__main__.CorruptSample"
    # The very class of the script: `except CorruptSample` catches it (under fork a
    # copy of the class came back, which no `except` names).
    assert (corrupt["caught_by_except"], corrupt["same_class"], corrupt["isinstance"]) == (
        True,
        True,
        True,
    )
    assert corrupt["message"] == "sample 3 is corrupt"
    assert corrupt["notes"][0] == "noted in __getitem__"
    assert corrupt["notes"][1].endswith(
        "during fetch of dataset index 3, in batch 1 (dataset indices [2, 3])."
    )
    # A class importable nowhere still comes back as a copy: same name, message, notes.
    assert local["type"].rsplit(".", 1)[-1] == "LocalError"
    assert (local["caught_by_except"], local["message"]) == (False, "local 5")
    assert local["notes"][0] == "noted in __getitem__"
    assert local["notes"][1].endswith(
        "during fetch of dataset index 5, in batch 2 (dataset indices [4, 5])."
    )
    assert len(corrupt["notes"]) == len(local["notes"]) == 2


# Each runs a Python process of its own (about 3 s): a script in the default run.
@pytest.mark.parametrize(
    "origin", ["script", *(pytest.param(o, marks=pytest.mark.slow) for o in ("cell", "stdin"))]
)
def test_worker_traceback_shows_the_users_file_line_and_source(
    start_method: str, origin: str
) -> None:
    # A class (the dataset) and a function (collate_fn) of __main__ fail in a worker:
    # defined in a script, in a notebook cell (its source only in linecache), or read
    # from standard input (no source anywhere). Spawn and forkserver workers get them
    # by value (cloudpickle), which renamed their code "<dynamic-code>".
    script = SCRIPTS / "worker_tracebacks.py"
    text = script.read_text()
    command = [sys.executable, str(script), start_method, origin]
    if origin == "stdin":
        command[1] = "-"
    child = subprocess.run(
        command,
        input=text if origin == "stdin" else None,
        capture_output=True,
        text=True,
        timeout=120,
        env=CHILD_ENV,
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    lines = text.splitlines()
    # A cell holds the lines after the marker: its line 1 is the file's line `skip + 1`.
    skip = lines.index("# --- user code ---") + 1 if origin == "cell" else 0
    name = {"script": str(script), "cell": report["cell"], "stdin": "<stdin>"}[origin]
    for key, function, source in [
        ("dataset", "__getitem__", 'raise ValueError(f"scan {index} is corrupt")'),
        ("collate", "stack_labels", 'raise LookupError(f"no label for {batch}")'),
    ]:
        note = report[key].splitlines()
        line = next(n for n, content in enumerate(lines, 1) if content.strip() == source) - skip
        frame = note.index(f'  File "{name}", line {line}, in {function}')
        if origin == "stdin":
            assert note[frame + 1].startswith(("ValueError", "LookupError")), note
            assert note[-1] == (
                '(No source lines for "<stdin>": that code was read from standard input '
                "(python -), which no file keeps.)"
            )
        else:
            assert note[frame + 1].strip() == source, note


@pytest.mark.parametrize("start_method", CHEAP_METHODS)
def test_exception_class_that_cannot_travel_becomes_worker_error(start_method: str) -> None:
    loader = _loader(FailsAt("LockedError", bad=1), start_method, batch_size=2)

    with pytest.raises(WorkerError) as info:
        next(iter(loader))

    exc = info.value
    assert type(exc) is WorkerError
    qualname = "_unpicklable_local_error_class.<locals>.LockedError"
    assert f"{__name__}.{qualname}: locked 1" in str(exc)
    assert "could not be imported in the main process" in str(exc)
    ctx = exc.conveyor_context
    assert (ctx.worker_id, ctx.stage, ctx.indices) == (0, "fetch", (0, 1))
    assert "LockedError: locked 1" in ctx.traceback


# --- collate_fn, worker_init_fn, IterableDataset -------------------------------


def test_collate_fn_error_keeps_its_type(start_method: str) -> None:
    loader = _loader(
        FailsAt("KeyError", bad=-1), start_method, batch_size=2, collate_fn=collate_fails_on_3
    )
    it = iter(loader)
    assert next(it) == [0, 1]

    with pytest.raises(ValueError) as info:
        next(it)

    assert str(info.value) == "cannot collate [2, 3]"
    ctx = info.value.conveyor_context
    assert (ctx.worker_id, ctx.stage, ctx.indices) == (0, "collate", (2, 3))
    note = _note(info.value)
    assert "during collate of batch 1 (dataset indices [2, 3])." in note  # no culprit known
    assert "in collate_fails_on_3" in note


def test_worker_init_fn_error_keeps_its_type(start_method: str) -> None:
    loader = _loader(
        FailsAt("KeyError", bad=-1), start_method, batch_size=2, worker_init_fn=init_fails
    )

    with pytest.raises(PermissionError) as info:
        next(iter(loader))

    ctx = info.value.conveyor_context
    assert (ctx.worker_id, ctx.stage, ctx.indices) == (0, "worker_init", ())
    assert str(info.value) == f"worker 0 (pid {ctx.pid}) cannot open the shards"  # its own pid
    assert ctx.pid != os.getpid()
    note = _note(info.value)
    assert f"worker 0 (pid {ctx.pid}) during worker_init" in note
    assert "in init_fails" in note


@pytest.mark.parametrize(("start_method", "where"), matrix([("mid_way",), ("at_iter",)]))
def test_iterable_dataset_error_keeps_its_type(start_method: str, where: str) -> None:
    loader = _loader(IterFails(where), start_method, batch_size=2)
    it = iter(loader)
    if where == "mid_way":
        assert next(it).tolist() == [0, 1]
        message = "shard 2 truncated"
    else:
        message = "shard list unreachable"

    with pytest.raises(OSError) as info:
        next(it)

    assert str(info.value) == message
    assert type(info.value) is OSError
    ctx = info.value.conveyor_context
    assert (ctx.worker_id, ctx.stage, ctx.indices) == (0, "fetch", ())
    assert ("in __iter__" if where == "at_iter" else "in _items") in _note(info.value)


# --- results that cannot be sent back ------------------------------------------


@pytest.mark.parametrize(
    ("start_method", "what", "batch_size", "path", "type_name"),
    matrix(
        [
            ("file", None, "sample", "_io.BufferedReader"),
            ("generator", None, "sample", "builtins.generator"),
            ("file_in_dict", 2, "sample[1]['handle']", "_io.BufferedReader"),
        ]
    ),
)
def test_unpicklable_sample_raises_at_once_naming_index_and_type(
    start_method: str, what: str, batch_size: int | None, path: str, type_name: str
) -> None:
    collate = list if batch_size else None
    loader = _loader(UnsendableAt3(what), start_method, batch_size=batch_size, collate_fn=collate)
    it = iter(loader)
    received = [next(it)] if batch_size else [next(it), next(it), next(it)]
    assert received == ([[0, 1]] if batch_size else [0, 1, 2])
    started = time.monotonic()

    with pytest.raises(UnpicklableError) as info:
        next(it)

    assert time.monotonic() - started < 10  # no hang (torch hangs here)
    exc = info.value
    assert isinstance(exc, TypeError)
    assert isinstance(exc, pickle.PicklingError)
    assert (exc.path, exc.type_name) == (path, type_name)
    where = "dataset index 3" if batch_size is None else "dataset indices [2, 3]"
    assert where in str(exc)
    assert f"{path} is a {type_name}" in str(exc)
    ctx = exc.conveyor_context
    expected_indices = (3,) if batch_size is None else (2, 3)
    assert (ctx.worker_id, ctx.stage, ctx.indices) == (0, "transfer", expected_indices)


# --- datasets that cannot be sent to workers -----------------------------------


@pytest.mark.parametrize(
    ("what", "path", "type_name"),
    [
        ("binary_file", "dataset.fh", "_io.BufferedReader"),
        ("sqlite", "dataset.db.conn", "sqlite3.Connection"),
    ],
)
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_unpicklable_dataset_is_named_before_workers_start(
    start_method: str, what: str, path: str, type_name: str
) -> None:
    dataset = HoldsHandle(what)
    loader = _loader(dataset, start_method, batch_size=2)
    before = leaks.LeakSnapshot.take()
    try:
        with pytest.raises(UnpicklableError) as info:
            iter(loader)
        assert leaks.new_processes(before) == []  # raised before any worker started
    finally:
        dataset.close()

    exc = info.value
    assert isinstance(exc, TypeError)
    assert (exc.path, exc.type_name) == (path, type_name)
    message = str(exc)
    assert f"start method '{start_method}'" in message
    assert f"{path} is a {type_name}" in message
    # A handle must not be "fixed" by forking: the workers would share it.
    assert "multiprocessing_context='fork'" not in message
    assert "conveyor.per_worker(" in message


@pytest.mark.parametrize("what", ["binary_file", "sqlite"])
def test_dataset_holding_a_handle_works_under_fork(what: str) -> None:
    dataset = HoldsHandle(what)  # the file is shared (pre-flight warns); :memory: sqlite is not
    shared = pytest.warns(PreflightWarning, match=r"dataset\.fh")
    try:
        with shared if what == "binary_file" else contextlib.nullcontext():
            batches = [b.tolist() for b in _loader(dataset, "fork", batch_size=2)]
    finally:
        dataset.close()
    assert batches == [[0, 1], [2, 3]]


# --- what cloudpickle makes possible -------------------------------------------


def test_closure_dataset_and_lambda_collate_work(start_method: str) -> None:
    scale = 10

    class Local:  # defined in the test: only cloudpickle can send it
        def __len__(self) -> int:
            return 5

        def __getitem__(self, index: int) -> int:
            return index * scale

    loader = _loader(
        Local(), start_method, batch_size=2, collate_fn=lambda batch: [x + 1 for x in batch]
    )
    assert list(loader) == [[1, 11], [21, 31], [41]]


_MAIN_PID = os.getpid()


def _rebuild_here_only_in_a_worker(value: int) -> int:
    if os.getpid() == _MAIN_PID:
        raise LookupError(f"cannot rebuild {value} in the main process")
    return value


class RebuildsOnlyInWorkers:
    """Pickles fine in a worker; unpickling it in the main process raises."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_here_only_in_a_worker, (self.value,))


class UndecodableBatches:
    """Every batch carries an array (so it travels in a shared-memory slot) and an
    object that does not unpickle in the main process."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> Any:
        import numpy as np

        return {"x": np.full(1024, index), "odd": RebuildsOnlyInWorkers(index)}


def _keep_odd(samples: list[Any]) -> Any:
    import numpy as np

    return np.stack([s["x"] for s in samples]), [s["odd"] for s in samples]


def test_a_batch_that_does_not_decode_names_worker_indices_stage_and_frees_its_slot() -> None:
    # Under fork the worker shares _MAIN_PID but has its own pid.
    loader = DataLoader(
        UndecodableBatches(),
        batch_size=2,
        num_workers=1,
        multiprocessing_context="fork",
        collate_fn=_keep_odd,
    )
    it = iter(loader)
    failures = 0
    for expected in range(20):  # far more batches than the worker has slots
        with pytest.raises(LookupError, match="in the main process") as info:
            next(it)
        context = info.value.conveyor_context  # type: ignore[attr-defined]
        assert (context.worker_id, context.stage, context.indices) == (
            0,
            "decode",
            (2 * expected, 2 * expected + 1),
        )
        failures += 1
    # Each failed batch gave its slot back: no BatchesHeldWarning (warnings are
    # errors here), and the loop ends normally.
    assert list(it) == []
    assert failures == 20


class StopsAtFive:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 5:
            raise StopIteration
        return index


def test_stop_iteration_in_a_workers_getitem_raises_instead_of_ending_the_epoch(
    start_method: str,
) -> None:
    loader = DataLoader(
        StopsAtFive(), batch_size=2, num_workers=2, multiprocessing_context=start_method
    )
    it = iter(loader)
    assert [b.tolist() for b in (next(it), next(it))] == [[0, 1], [2, 3]]
    with pytest.raises(RuntimeError, match=r"raised StopIteration .* indices \[4, 5\]") as info:
        next(it)
    assert info.value.conveyor_context.stage == "fetch"  # type: ignore[attr-defined]
    assert [b.tolist() for b in it] == [[6, 7]]
