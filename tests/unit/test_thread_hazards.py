"""Pre-flight for thread workers: what the threads would share (one file position, a SQLite
connection bound to its thread, a socket, a generator) is named at its attribute path; the
process-only checks (fork-shared handles, pickling, CPU count) stay quiet."""

from __future__ import annotations

import socket
import sqlite3
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor import ConfigError, DataLoader, PreflightWarning, Report, Severity, check


class Holder:
    """A map-style dataset whose attributes the tests fill in."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


class Lookup(Holder):
    """Reads each sample from the SQLite connection it holds."""

    def __getitem__(self, index: int) -> int:
        return int(self.db.execute("SELECT ?", (index,)).fetchone()[0])


def problems(report: Report) -> list[tuple[str, Severity, str]]:
    return [(f.code, f.severity, f.where) for f in report.findings if f.severity > Severity.INFO]


def threads_check(dataset: Any, **options: Any) -> Report:
    return check(dataset, num_workers=4, worker_method="thread", **options)


@pytest.fixture
def binary_file(tmp_path: Path) -> Iterator[Any]:
    path = tmp_path / "shard.bin"
    path.write_bytes(b"\x00" * 64)
    with path.open("rb") as fh:
        yield fh


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "index.sqlite"
    sqlite3.connect(path).close()
    return path


def test_a_shared_file_is_one_position_for_all_threads(binary_file: Any) -> None:
    report = threads_check(Holder(fh=binary_file))
    assert problems(report) == [("thread-shared-file", Severity.WARNING, "dataset.fh")]
    finding = report.findings[0]
    assert "position" in finding.why and "thread worker" in finding.what
    assert f"conveyor.per_worker(open, {binary_file.name!r}, 'rb')" in finding.fix
    assert "thread workers" in report.subject


def test_a_sqlite_connection_bound_to_its_thread_is_an_error(database: Path) -> None:
    with sqlite3.connect(database) as conn:
        report = threads_check(Holder(db=conn))
        assert problems(report) == [("thread-sqlite", Severity.ERROR, "dataset.db")]
        assert "check_same_thread" in report.findings[0].why
        assert f"per_worker(sqlite3.connect, {str(database)!r})" in report.findings[0].fix
    conn.close()


def test_an_in_memory_database_is_shared_rather_than_reopened_empty() -> None:
    conn = sqlite3.connect(":memory:")
    report = threads_check(Holder(db=conn))
    assert problems(report) == [("thread-sqlite", Severity.ERROR, "dataset.db")]
    assert "check_same_thread=False" in report.findings[0].fix
    assert "per_worker" not in report.findings[0].fix
    conn.close()


def test_a_connection_made_to_be_shared_is_left_alone(database: Path) -> None:
    conn = sqlite3.connect(database, check_same_thread=False)
    assert problems(threads_check(Holder(db=conn))) == []
    conn.close()


def test_a_shared_socket_interleaves_requests() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as client,
    ):
        report = threads_check(Holder(sock=client))
    assert problems(report) == [("thread-shared-socket", Severity.WARNING, "dataset.sock")]


def test_a_shared_generator_is_named_and_the_threads_own_ones_offered() -> None:
    report = threads_check(Holder(rng=np.random.default_rng(0)))
    assert problems(report) == [("thread-shared-rng", Severity.WARNING, "dataset.rng")]
    assert "get_worker_info()" in report.findings[0].fix


def renew_rng(worker_id: int) -> None:
    info = conveyor.get_worker_info()
    assert info is not None
    info.dataset.rng = np.random.default_rng(info.seed)


def test_a_generator_renewed_in_worker_init_fn_is_not_reported() -> None:
    loader = DataLoader(
        Holder(rng=np.random.default_rng(0)),
        num_workers=2,
        worker_method="thread",
        worker_init_fn=renew_rng,
    )
    assert problems(check(loader)) == []


def test_process_only_checks_stay_quiet_for_threads(database: Path) -> None:
    """A lambda (unpicklable under spawn), a connection made to be shared (fork would
    share it), more workers than cores: none concerns threads."""
    conn = sqlite3.connect(database, check_same_thread=False)
    dataset = Holder(transform=lambda x: x, db=conn)
    report = check(dataset, num_workers=64, multiprocessing_context="spawn", worker_method="thread")
    assert problems(report) == []
    assert problems(check(dataset, num_workers=2, multiprocessing_context="fork"))
    conn.close()


def test_a_loader_is_checked_with_its_own_worker_method(binary_file: Any) -> None:
    loader = DataLoader(Holder(fh=binary_file), num_workers=2, worker_method="thread")
    assert [code for code, _, _ in problems(check(loader))] == ["thread-shared-file"]


def test_iterating_refuses_a_connection_the_threads_cannot_use(database: Path) -> None:
    conn = sqlite3.connect(database)
    before = threading.active_count()
    loader = DataLoader(Lookup(db=conn), batch_size=2, num_workers=2, worker_method="thread")
    with pytest.raises(ConfigError, match=r"dataset\.db.*per_worker"):
        iter(loader)
    assert threading.active_count() == before  # refused before any worker thread started
    # The hazard is real: without the pre-flight, every sample fails in the threads.
    unchecked = DataLoader(
        Lookup(db=conn), batch_size=2, num_workers=2, worker_method="thread", preflight=False
    )
    with pytest.raises(sqlite3.ProgrammingError, match="thread"):
        list(unchecked)
    conn.close()


def test_iterating_warns_once_and_loads(binary_file: Any) -> None:
    loader = DataLoader(Holder(fh=binary_file), batch_size=2, num_workers=2, worker_method="thread")
    shared = r"shared by the thread workers \(at dataset\.fh\)"
    with pytest.warns(PreflightWarning, match=shared) as record:
        first = [batch.tolist() for batch in loader]
    assert sum(issubclass(w.category, PreflightWarning) for w in record) == 1
    assert first == [[0, 1], [2, 3]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == 2  # said once per loader
