"""conveyor.per_worker in real workers: one resource per worker, closed when it exits.

The contrast case is here too: a file handle opened in ``__init__`` and shared
by forked workers corrupts reads (one file offset for all processes), which is
what the helper prevents.
"""

from __future__ import annotations

import os
import sqlite3
import time
import warnings
from pathlib import Path

import pytest

import conveyor
from tests.helpers.leaks import no_leaks

METHODS = ["fork", "spawn", "forkserver"]
OPENS = 0  # Resources opened in this process


class Resource:
    def __init__(self, marker_dir: str) -> None:
        global OPENS
        OPENS += 1
        self.opened_in = os.getpid()
        self.marker_dir = marker_dir

    def close(self) -> None:
        Path(self.marker_dir, f"closed-{os.getpid()}").touch()


class Probe(conveyor.Dataset):
    """Each sample says which process read it, with which resource."""

    def __init__(self, marker_dir: str, n: int = 16) -> None:
        self.resource = conveyor.per_worker(Resource, marker_dir)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, int, int]:
        res = self.resource.get()
        return (i, os.getpid(), res.opened_in, id(res), OPENS)


class Images(conveyor.Dataset):
    """The sqlite case from the docstring."""

    def __init__(self, db_path: str) -> None:
        self.db = conveyor.per_worker(sqlite3.connect, db_path)

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        row = self.db.get().execute("SELECT id, data FROM images WHERE id = ?", (i,)).fetchone()
        return (row[0], row[1])


class RawImages(Images):
    """The classic mistake: the connection itself, opened in __init__."""

    def __init__(self, db_path: str) -> None:
        self.connection = sqlite3.connect(db_path)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        raise AssertionError("never reached: the dataset cannot be sent to the worker")


class Lines(conveyor.Dataset):
    """Line i of a text file, by seek + readline, with a pause between the two.

    The pause stands for a little per-sample work; it makes the race between
    workers certain instead of likely.
    """

    def __init__(self, path: str, *, shared_handle: bool) -> None:
        self.offsets = [0]
        with open(path, "rb") as f:
            for line in f:
                self.offsets.append(self.offsets[-1] + len(line))
        self.offsets.pop()
        if shared_handle:  # the bug: one open file (one offset) for every worker
            self.file = open(path, "rb", buffering=0)  # noqa: SIM115
            self.handle = lambda: self.file
        else:
            self.handle = conveyor.per_worker(open, path, "rb", buffering=0)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> str:
        f = self.handle()
        f.seek(self.offsets[i])
        time.sleep(0.002)
        return f.readline().decode()


def _samples(loader) -> list:
    return [sample for batch in loader for sample in batch]


@pytest.mark.parametrize("method", METHODS)
def test_each_worker_opens_its_own_once_and_closes_it_at_exit(tmp_path, method):
    dataset = Probe(str(tmp_path))
    parent = dataset.resource.get()  # opened in the main process first: fork copies it
    with no_leaks():
        loader = conveyor.DataLoader(
            dataset, batch_size=2, num_workers=2, collate_fn=list, multiprocessing_context=method
        )
        samples = _samples(loader)
        del loader
    assert sorted(s[0] for s in samples) == list(range(16))
    workers = {s[1] for s in samples}
    assert len(workers) == 2 and os.getpid() not in workers
    for pid in workers:
        mine = [s for s in samples if s[1] == pid]
        assert {s[2] for s in mine} == {pid}  # opened in the worker itself
        assert len({s[3] for s in mine}) == 1  # the same object for every sample
        assert all(s[3] != id(parent) for s in mine)  # never the parent's inherited one
        # one open per worker (under fork the counter started at the parent's 1)
        assert {s[4] for s in mine} == {2 if method == "fork" else 1}
    # no_leaks() waited for the workers to exit: each closed its resource by then, or never.
    markers = [tmp_path / f"closed-{pid}" for pid in workers]
    assert all(m.exists() for m in markers), sorted(p.name for p in tmp_path.iterdir())
    assert not (tmp_path / f"closed-{os.getpid()}").exists()  # ours is still open
    dataset.resource.close()
    assert (tmp_path / f"closed-{os.getpid()}").exists()


def test_closed_when_the_loop_breaks_early_with_persistent_workers(tmp_path):
    dataset = Probe(str(tmp_path), n=64)
    with no_leaks():
        loader = conveyor.DataLoader(
            dataset, batch_size=2, num_workers=2, collate_fn=list, persistent_workers=True
        )
        pids = set()
        for epoch in range(2):
            for n, batch in enumerate(loader):
                pids |= {s[1] for s in batch}
                if n == 3:
                    break
            assert not list(tmp_path.iterdir()), f"closed during epoch {epoch}"
        del loader, batch
    markers = [tmp_path / f"closed-{pid}" for pid in pids]  # the workers have exited
    assert all(m.exists() for m in markers), sorted(p.name for p in tmp_path.iterdir())


@pytest.fixture
def image_db(tmp_path) -> str:
    path = tmp_path / "images.db"
    setup = sqlite3.connect(path)
    with setup:
        setup.execute("CREATE TABLE images (id INTEGER PRIMARY KEY, data BLOB)")
        setup.executemany(
            "INSERT INTO images VALUES (?, ?)", [(i, bytes([i]) * 100) for i in range(24)]
        )
    setup.close()
    return str(path)


@pytest.mark.parametrize("method", METHODS)
def test_sqlite_per_worker_under_every_start_method(image_db, method):
    dataset = Images(image_db)
    assert dataset[3] == (3, bytes([3]) * 100)  # the main process has its own connection
    with no_leaks():
        loader = conveyor.DataLoader(
            dataset, batch_size=4, num_workers=2, collate_fn=list, multiprocessing_context=method
        )
        rows = _samples(loader)
        del loader
    assert rows == [(i, bytes([i]) * 100) for i in range(24)]
    dataset.db.close()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_raw_sqlite_connection_cannot_even_reach_the_workers(image_db, method):
    dataset = RawImages(image_db)
    with no_leaks(), pytest.raises(TypeError, match="Connection"):  # pre-flight or at start
        next(iter(conveyor.DataLoader(dataset, num_workers=2, multiprocessing_context=method)))
    dataset.connection.close()


@pytest.fixture
def text_file(tmp_path) -> tuple[str, list[str]]:
    lines = [f"line {i} " + "x" * (i % 7) + "\n" for i in range(120)]
    path = tmp_path / "lines.txt"
    path.write_text("".join(lines))
    return str(path), lines


def _read_all(dataset: Lines) -> list[str]:
    loader = conveyor.DataLoader(
        dataset, batch_size=4, num_workers=2, collate_fn=list, multiprocessing_context="fork"
    )
    with no_leaks():
        got = _samples(loader)
        del loader
    return got


def test_per_worker_file_handles_read_correct_lines_under_fork(text_file):
    path, lines = text_file
    dataset = Lines(path, shared_handle=False)
    dataset.handle.get()  # opened in the parent before forking: still not shared
    assert _read_all(dataset) == lines
    dataset.handle.close()


def test_a_handle_opened_in_init_corrupts_reads_under_fork(text_file):
    """The bug per_worker prevents: two processes, one file offset."""
    path, lines = text_file
    dataset = Lines(path, shared_handle=True)
    try:
        with warnings.catch_warnings():
            # A pre-flight check may rightly warn about this very handle.
            warnings.simplefilter("ignore", conveyor.ConveyorWarning)
            got = _read_all(dataset)
    finally:
        dataset.file.close()
    wrong = [i for i, (a, b) in enumerate(zip(got, lines, strict=True)) if a != b]
    assert wrong, "both workers read through one shared offset, yet every line came out right"


def test_torch_workers_close_them_too(tmp_path):
    """torch's workers also end with os._exit; multiprocessing's exit finalizers
    still run there, and that is where per_worker registers."""
    torch_data = pytest.importorskip("torch.utils.data")
    dataset = Probe(str(tmp_path))
    with no_leaks():
        loader = torch_data.DataLoader(
            dataset, batch_size=2, num_workers=2, collate_fn=list, multiprocessing_context="fork"
        )
        pids = {s[1] for s in _samples(loader)}
        del loader
    markers = [tmp_path / f"closed-{pid}" for pid in pids]  # the workers have exited
    assert len(pids) == 2 and all(m.exists() for m in markers)
