"""conveyor.per_worker: a resource opened lazily, once per process, pickled as its recipe."""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import pickle
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

import conveyor
from conveyor import resources

ROOT = Path(__file__).resolve().parents[2]
OPENS = 0  # how many Resources this process opened


class Resource:
    """Records who opened it and whether it was closed."""

    def __init__(self, name: str = "r", marker_dir: str | None = None) -> None:
        global OPENS
        OPENS += 1
        self.name = name
        self.opened_in = os.getpid()
        self.marker_dir = marker_dir
        self.closed = 0

    def close(self) -> None:
        self.closed += 1
        if self.marker_dir is not None:
            Path(self.marker_dir, f"closed-{self.name}-{os.getpid()}").touch()


@pytest.fixture(autouse=True)
def _reset_counter():
    global OPENS
    OPENS = 0


def test_opens_lazily_once_per_process():
    r = conveyor.per_worker(Resource, "a")
    assert OPENS == 0 and not r.is_open
    first = r.get()
    assert OPENS == 1 and r.is_open
    assert r.get() is first and r() is first  # calling the object is get()
    assert OPENS == 1
    r.close()


def test_factory_arguments_and_keywords():
    r = conveyor.per_worker(dict, [("a", 1)], b=2)
    assert r.get() == {"a": 1, "b": 2}


def test_close_closes_and_the_next_get_reopens():
    r = conveyor.per_worker(Resource)
    first = r.get()
    r.close()
    assert first.closed == 1 and not r.is_open
    r.close()  # nothing open: nothing to do
    assert first.closed == 1
    second = r.get()
    assert second is not first and OPENS == 2
    r.close()
    assert second.closed == 1


def test_custom_close_and_resources_without_close():
    closed = []
    r = conveyor.per_worker(Resource, close=closed.append)
    res = r.get()
    r.close()
    assert closed == [res] and res.closed == 0  # the custom close replaces .close()
    plain = conveyor.per_worker(list)
    plain.get()
    plain.close()  # a list has no close(): nothing is called


def test_garbage_collection_closes_the_resource():
    r = conveyor.per_worker(Resource)
    res = r.get()
    del r
    gc.collect()
    assert res.closed == 1


def test_an_open_file_is_closed_without_resource_warning(tmp_path):
    # pytest turns a ResourceWarning (an unclosed file collected) into an error.
    path = tmp_path / "lines.txt"
    path.write_text("one\ntwo\n")
    r = conveyor.per_worker(open, path, encoding="utf-8")
    assert r.get().readline() == "one\n"
    handle = r.get()
    del r
    gc.collect()
    assert handle.closed


def test_close_all_closes_newest_first_and_reports_failures(capfd):
    order = []
    a = conveyor.per_worker(Resource, "a", close=lambda res: order.append(res.name))
    b = conveyor.per_worker(Resource, "b", close=lambda res: 1 / 0)
    c = conveyor.per_worker(Resource, "c", close=lambda res: order.append(res.name))
    unopened = conveyor.per_worker(Resource, "d")
    for r in (a, b, c):
        r.get()
    resources.close_all()
    assert order == ["c", "a"]  # b failed, the others were still closed
    assert not any(r.is_open for r in (a, b, c, unopened))
    err = capfd.readouterr().err
    assert "closing the per-worker resource" in err and "ZeroDivisionError" in err


def test_factory_errors_propagate_and_the_next_get_retries():
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("database not ready")
        return "connected"

    r = conveyor.per_worker(flaky)
    with pytest.raises(ConnectionError, match="not ready"):
        r.get()
    assert not r.is_open
    assert r.get() == "connected"


def test_one_open_when_threads_race():
    def slow_open() -> Resource:
        time.sleep(0.05)
        return Resource()

    r = conveyor.per_worker(slow_open)
    barrier = threading.Barrier(8)
    got = []

    def use() -> None:
        barrier.wait()
        got.append(r.get())

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert OPENS == 1 and len({id(x) for x in got}) == 1
    r.close()


def test_a_factory_may_use_another_per_worker_resource():
    inner = conveyor.per_worker(Resource, "inner")
    outer = conveyor.per_worker(lambda: ("outer", inner.get()))
    assert outer.get()[1] is inner.get()
    inner.close()


def test_pickles_as_its_recipe_never_the_open_handle(tmp_path):
    db = tmp_path / "db.sqlite"
    r = conveyor.per_worker(sqlite3.connect, str(db))
    connection = r.get()
    with pytest.raises(TypeError):  # what a dataset holding the connection itself hits
        pickle.dumps(connection)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        copy_ = pickle.loads(dumps(r))
        assert isinstance(copy_, conveyor.PerWorker) and not copy_.is_open
        other = copy_.get()
        assert other is not connection
        assert other.execute("SELECT 1").fetchone() == (1,)
        copy_.close()
    r.close()


def test_copies_open_their_own_resource():
    r = conveyor.per_worker(Resource)
    res = r.get()
    for c in (copy.copy(r), copy.deepcopy(r)):
        assert not c.is_open
        assert c.get() is not res
        c.close()
    r.close()
    assert res.closed == 1


def test_sqlite_docstring_example(tmp_path):
    db = tmp_path / "images.db"
    with sqlite3.connect(db) as setup:
        setup.execute("CREATE TABLE images (id INTEGER PRIMARY KEY, data BLOB)")
        setup.executemany("INSERT INTO images VALUES (?, ?)", [(i, bytes([i])) for i in range(4)])
    setup.close()

    class Images(conveyor.Dataset):
        def __init__(self, db_path):
            self.db = conveyor.per_worker(sqlite3.connect, db_path)

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return self.db.get().execute("SELECT data FROM images WHERE id = ?", (i,)).fetchone()

    ds = Images(str(db))
    assert [ds[i] for i in range(4)] == [(bytes([i]),) for i in range(4)]
    ds.db.close()


def test_an_open_resource_instead_of_a_factory_is_explained():
    connection = sqlite3.connect(":memory:")  # callable, but already open
    for bad in (connection, "not a function"):
        with pytest.raises(TypeError, match=r"per_worker\(sqlite3.connect, path\)"):
            conveyor.per_worker(bad)
    connection.close()


def test_repr_names_the_recipe_and_the_state():
    r = conveyor.per_worker(sqlite3.connect, ":memory:", timeout=2)
    assert repr(r) == "<PerWorker sqlite3.connect(':memory:', timeout=2): not open in this process>"
    r.get()
    assert f"open in pid {os.getpid()}" in repr(r)
    r.close()


def _report_from_child(r, conn) -> None:
    res = r.get()
    conn.send((os.getpid(), res.opened_in, id(res), OPENS, r.is_open))
    conn.close()


def test_a_forked_child_opens_its_own_and_leaves_the_parents_alone():
    r = conveyor.per_worker(Resource)
    parent_res = r.get()
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_report_from_child, args=(r, send))
    child.start()
    send.close()
    pid, opened_in, res_id, opens, is_open = receive.recv()
    child.join()
    receive.close()
    assert child.exitcode == 0
    assert opened_in == pid != os.getpid()
    assert res_id != id(parent_res)  # the parent's object, inherited at the same address
    assert opens == 2  # the parent's open, copied by fork, and the child's own
    assert is_open
    assert parent_res.closed == 0  # the child closed only its own at exit
    assert r.get() is parent_res
    r.close()


@pytest.mark.slow  # a Python process of its own, with workers (about 3.5 s)
def test_closed_at_main_process_exit(tmp_path):
    code = textwrap.dedent(
        f"""
        import conveyor
        from tests.unit.test_resources import Resource
        keep = conveyor.per_worker(Resource, "main", {str(tmp_path)!r})
        keep.get()
        handle = conveyor.per_worker(open, {str(tmp_path / "f.txt")!r}, "w")
        handle.get().write("flushed at exit")
        """
    )
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "ResourceWarning" not in result.stderr, result.stderr
    assert len(list(tmp_path.glob("closed-main-*"))) == 1
    assert (tmp_path / "f.txt").read_text() == "flushed at exit"
