"""conveyor.check: each classic hazard built for real, found at its attribute path with
the right code and severity under each start method; ordinary datasets stay quiet."""

from __future__ import annotations

import functools
import os
import random
import socket
import sqlite3
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor import ConfigError, DataLoader, Finding, Report, Severity, check
from conveyor.diagnostics import environment, fork_hazards
from conveyor.diagnostics.environment import Cpus
from conveyor.diagnostics.findings import ENVIRONMENT
from conveyor.diagnostics.preflight import automatic_findings
from conveyor.diagnostics.walk import MAX_DEPTH, MAX_ITEMS, MAX_OBJECTS, Walk

PICKLED = ["spawn", "forkserver"]  # start methods that pickle the dataset
ALL = ["fork", *PICKLED]


class Holder:
    """A dataset whose attributes the tests fill in."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


class Db:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


def only(report: Report, code: str) -> Finding:
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report
    return found[0]


def problems(report: Report) -> list[tuple[str, Severity, str]]:
    return [(f.code, f.severity, f.where) for f in report.findings if f.severity > Severity.INFO]


@pytest.fixture
def binary_file(tmp_path: Path) -> Iterator[Any]:
    path = tmp_path / "shard.bin"
    path.write_bytes(b"\x00" * 64)
    with path.open("rb") as fh:
        yield fh


@pytest.fixture
def text_file(tmp_path: Path) -> Iterator[Any]:
    path = tmp_path / "labels.txt"
    path.write_text("cat\ndog\n")
    with path.open() as fh:
        yield fh


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "index.sqlite")
    yield conn
    conn.close()


@pytest.fixture
def tcp_client() -> Iterator[socket.socket]:
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as client,
    ):
        yield client


@pytest.fixture
def running_thread() -> Iterator[threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="metrics-uploader", daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join()


# --- fork: handles the workers would share ------------------------------------------------


def test_open_file_is_shared_under_fork(binary_file: Any) -> None:
    report = check(Holder(fh=binary_file), num_workers=2, multiprocessing_context="fork")
    assert problems(report) == [("shared-file-handle", Severity.WARNING, "dataset.fh")]
    finding = only(report, "shared-file-handle")
    assert binary_file.name in finding.what
    assert f"conveyor.per_worker(open, {binary_file.name!r}, 'rb')" in finding.fix


def test_nested_sqlite_connection_is_an_error_under_fork(sqlite_file: sqlite3.Connection) -> None:
    report = check(Holder(db=Db(sqlite_file)), num_workers=2, multiprocessing_context="fork")
    assert problems(report) == [("shared-sqlite", Severity.ERROR, "dataset.db.conn")]
    assert "conveyor.per_worker(sqlite3.connect, '" in report.errors[0].fix
    assert not report.ok


def test_in_memory_sqlite_is_not_shared_under_fork() -> None:
    conn = sqlite3.connect(":memory:")  # each forked child gets its own copy of the pages
    try:
        report = check(Holder(db=Db(conn)), num_workers=2, multiprocessing_context="fork")
    finally:
        conn.close()
    assert report.ok, report


def test_socket_is_shared_under_fork(tcp_client: socket.socket) -> None:
    report = check(Holder(client=tcp_client), num_workers=2, multiprocessing_context="fork")
    assert problems(report) == [("shared-socket", Severity.WARNING, "dataset.client")]
    warning = report.warnings[0]
    assert "connected to 127.0.0.1:" in warning.what
    assert "conveyor.per_worker(socket.create_connection, ('127.0.0.1', " in warning.fix


def test_closed_handles_are_not_hazards(tmp_path: Path) -> None:
    fh = (tmp_path / "x.bin").open("wb")
    fh.close()
    conn = sqlite3.connect(tmp_path / "x.sqlite")
    conn.close()
    sock = socket.socket()
    sock.close()
    dataset = Holder(fh=fh, db=Db(conn), sock=sock)
    assert check(dataset, num_workers=2, multiprocessing_context="fork").ok
    # Closed, they still cannot be pickled: spawn fails on each.
    spawn = check(dataset, num_workers=2, multiprocessing_context="spawn")
    assert [f.where for f in spawn.errors] == ["dataset.fh", "dataset.db.conn", "dataset.sock"]


def test_running_thread_is_a_fork_hazard_only(running_thread: threading.Thread) -> None:
    fork = check(list(range(10)), num_workers=2, multiprocessing_context="fork")
    assert problems(fork) == [("parent-threads", Severity.WARNING, ENVIRONMENT)]
    assert "'metrics-uploader'" in fork.warnings[0].what
    assert "forkserver" in fork.warnings[0].fix
    for method in PICKLED:
        assert check(list(range(10)), num_workers=2, multiprocessing_context=method).ok


def test_handles_reached_through_functions_are_named(sqlite_file: sqlite3.Connection) -> None:
    class Collate:
        def __init__(self) -> None:
            self.conn = sqlite_file

        def collate(self, batch: list[int]) -> list[int]:
            return batch

    def init_with(conn: sqlite3.Connection) -> Any:
        def worker_init_fn(worker_id: int) -> None:
            conn.execute("SELECT 1")

        return worker_init_fn

    def where(**functions: Any) -> list[str]:
        loader = DataLoader(
            list(range(4)), num_workers=1, multiprocessing_context="fork", **functions
        )
        return [f.where for f in check(loader).errors]

    assert where(collate_fn=Collate().collate) == ["collate_fn.__self__.conn"]
    assert where(worker_init_fn=init_with(sqlite_file)) == ["worker_init_fn.<closure var 'conn'>"]
    # One connection reached twice: named once, by its shortest path.
    both = where(collate_fn=Collate().collate, worker_init_fn=init_with(sqlite_file))
    assert both == ["worker_init_fn.<closure var 'conn'>"]


def test_h5py_and_lmdb_are_recognised_only_when_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class File:  # stands in for h5py.File: truthy while open, .file.filename
        def __init__(self, filename: str) -> None:
            self.filename = filename
            self.file = self

        def __bool__(self) -> bool:
            return True

    class Environment:
        def path(self) -> str:
            return str(tmp_path / "train.lmdb")

    dataset = Holder(h5=File(str(tmp_path / "train.h5")), env=Environment())
    assert check(dataset, num_workers=2, multiprocessing_context="fork").ok  # modules absent
    h5py = types.ModuleType("h5py")
    h5py.File, h5py.Group, h5py.Dataset = File, File, File  # type: ignore[attr-defined]
    lmdb = types.ModuleType("lmdb")
    lmdb.Environment = Environment  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "h5py", h5py)
    monkeypatch.setitem(sys.modules, "lmdb", lmdb)
    report = check(dataset, num_workers=2, multiprocessing_context="fork")
    assert problems(report) == [
        ("shared-hdf5", Severity.WARNING, "dataset.h5"),
        ("shared-lmdb", Severity.WARNING, "dataset.env"),
    ]
    assert "conveyor.per_worker(h5py.File, " in report.warnings[0].fix
    assert "conveyor.per_worker(lmdb.open, " in report.warnings[1].fix


# --- spawn and forkserver: what cannot be sent --------------------------------------------


@pytest.mark.parametrize("method", PICKLED)
def test_binary_file_cannot_be_sent(method: str, binary_file: Any) -> None:
    report = check(Holder(fh=binary_file), num_workers=2, multiprocessing_context=method)
    assert problems(report) == [("unpicklable", Severity.ERROR, "dataset.fh")]
    error = report.errors[0]
    assert "_io.BufferedReader, which cannot be pickled" in error.why
    assert "conveyor.per_worker(open, " in error.fix


@pytest.mark.parametrize("method", PICKLED)
def test_nested_sqlite_and_socket_cannot_be_sent(
    method: str, sqlite_file: sqlite3.Connection, tcp_client: socket.socket
) -> None:
    report = check(
        Holder(db=Db(sqlite_file), client=tcp_client),
        num_workers=2,
        multiprocessing_context=method,
    )
    assert problems(report) == [
        ("unpicklable", Severity.ERROR, "dataset.db.conn"),
        ("unpicklable", Severity.ERROR, "dataset.client"),
    ]


@pytest.mark.parametrize("method", PICKLED)
def test_text_file_open_for_reading_travels_as_a_frozen_copy(method: str, text_file: Any) -> None:
    report = check(Holder(labels=text_file), num_workers=2, multiprocessing_context=method)
    assert problems(report) == [("file-copied", Severity.WARNING, "dataset.labels")]
    assert "copy" in report.warnings[0].why


def test_text_file_is_shared_under_fork(text_file: Any) -> None:
    report = check(Holder(labels=text_file), num_workers=2, multiprocessing_context="fork")
    assert problems(report) == [("shared-file-handle", Severity.WARNING, "dataset.labels")]


@pytest.mark.parametrize("method", ALL)
def test_lambdas_and_closures_are_fine(method: str) -> None:
    offset = 3
    dataset = Holder(transform=lambda x: x + offset, table={"a": (1, 2)})
    loader = DataLoader(
        dataset, num_workers=2, collate_fn=lambda b: b, multiprocessing_context=method
    )
    assert check(loader).findings == ()


@pytest.mark.parametrize("method", PICKLED)
def test_handle_dropped_by_getstate_is_not_an_error(method: str, binary_file: Any) -> None:
    class Reopens(Holder):
        def __getstate__(self) -> dict[str, Any]:
            return {k: v for k, v in self.__dict__.items() if k != "fh"}

    dataset = Reopens(fh=binary_file)
    assert check(dataset, num_workers=2, multiprocessing_context=method).ok
    loader = DataLoader(dataset, num_workers=2, multiprocessing_context=method)
    assert automatic_findings(loader._config) == []
    # Under fork the handle is still in the child's memory, shared.
    fork = check(dataset, num_workers=2, multiprocessing_context="fork")
    assert problems(fork) == [("shared-file-handle", Severity.WARNING, "dataset.fh")]


@pytest.mark.parametrize("method", ALL)
def test_a_file_in_a_function_default_gets_the_precise_recipe(
    method: str, binary_file: Any
) -> None:
    def collate(batch: list[Any], fh: Any = binary_file) -> list[Any]:
        return batch

    loader = DataLoader(
        list(range(4)), num_workers=1, collate_fn=collate, multiprocessing_context=method
    )
    code = "shared-file-handle" if method == "fork" else "unpicklable"
    report = check(loader)
    assert [(f.code, f.where) for f in report.findings] == [(code, "collate_fn.<default 'fh'>")]
    recipe = f"conveyor.per_worker(open, {binary_file.name!r}, 'rb')"
    assert f"make {recipe} the default of fh in collate_fn instead" in report.findings[0].fix


# --- copy-on-read ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ALL)
def test_large_list_attribute_is_copied_into_every_worker(method: str) -> None:
    dataset = Holder(paths=[f"/data/{i:07d}.jpg" for i in range(200_000)])
    report = check(dataset, num_workers=2, multiprocessing_context=method)
    assert problems(report) == [("large-python-container", Severity.WARNING, "dataset.paths")]
    finding = report.warnings[0]
    assert "200,000" in finding.what
    assert "MB" in finding.why
    assert "conveyor.SharedList(" in finding.fix


def test_large_dict_and_object_array_are_copied_too() -> None:
    dataset = Holder(
        meta={i: str(i) for i in range(150_000)},
        names=np.array([str(i) for i in range(120_000)], dtype=object),
        pixels=np.zeros(1_000_000, dtype=np.uint8),  # plain arrays are fine
    )
    report = check(dataset, num_workers=2, multiprocessing_context="fork")
    assert problems(report) == [
        ("large-python-container", Severity.WARNING, "dataset.meta"),
        ("large-python-container", Severity.WARNING, "dataset.names"),
    ]
    assert "dtype=object" in report.warnings[1].what


# --- random generators and raw descriptors -------------------------------------------------


@pytest.mark.parametrize("method", ALL)
def test_numpy_generator_made_in_init_starts_the_same_in_every_worker(method: str) -> None:
    dataset = Holder(rng=np.random.default_rng(0), augment=Holder(state=np.random.RandomState(0)))
    report = check(dataset, num_workers=2, multiprocessing_context=method)
    assert problems(report) == [
        ("shared-rng", Severity.WARNING, "dataset.rng"),
        ("shared-rng", Severity.WARNING, "dataset.augment.state"),
    ]
    generator, legacy = report.warnings
    assert "numpy.random.Generator" in generator.what
    assert "draw the same numbers" in generator.why
    assert "info = conveyor.get_worker_info()" in generator.fix
    assert "info.dataset.rng = np.random.default_rng(info.seed)" in generator.fix
    assert "create it lazily in the worker" in generator.fix
    assert "info.dataset.augment.state = np.random.RandomState(info.seed % 2**32)" in legacy.fix


@pytest.mark.parametrize("method", ALL)
def test_global_random_state_is_not_a_finding(method: str) -> None:
    # Each worker reseeds NumPy's global generator and Python's random, as torch's do.
    dataset = Holder(np_random=np.random, legacy=np.random.mtrand._rand, stdlib=random)
    assert check(dataset, num_workers=2, multiprocessing_context=method).ok
    assert check(Holder(entropy=random.SystemRandom()), multiprocessing_context="fork").ok


def test_generator_renewed_in_worker_init_fn_is_not_reported() -> None:
    def reseed(worker_id: int) -> None:
        info = conveyor.get_worker_info()
        assert info is not None
        info.dataset.rng = np.random.default_rng(info.seed)

    def seed_global_only(worker_id: int) -> None:  # the classic recipe: not this generator
        np.random.seed(worker_id)

    dataset = Holder(rng=np.random.default_rng(0))
    for init, found in ((reseed, []), (seed_global_only, ["shared-rng"])):
        loader = DataLoader(dataset, num_workers=2, worker_init_fn=init)
        assert [f.code for f in automatic_findings(loader._config)] == found


@pytest.fixture
def raw_fd(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    path = tmp_path / "shard.bin"
    path.write_bytes(b"\x00" * 64)
    fd = os.open(path, os.O_RDONLY)
    yield fd, path
    os.close(fd)


@pytest.mark.parametrize("method", PICKLED)
def test_raw_descriptor_is_a_bare_number_in_spawned_workers(
    method: str, raw_fd: tuple[int, Path]
) -> None:
    fd, path = raw_fd
    report = check(Holder(fd=fd), num_workers=2, multiprocessing_context=method)
    assert problems(report) == [("raw-fd", Severity.WARNING, "dataset.fd")]
    finding = report.warnings[0]
    assert f"fd {fd}, {str(path)!r}" in finding.what
    assert f"dataset.fd is the int {fd}" in finding.why
    recipe = f"conveyor.per_worker(os.open, {str(path)!r}, os.O_RDONLY, close=os.close)"
    assert f"store {recipe} in dataset.fd instead" in finding.fix
    # Under fork the worker inherits the descriptor itself.
    assert check(Holder(fd=fd), num_workers=2, multiprocessing_context="fork").ok


@pytest.mark.parametrize("method", PICKLED)
def test_descriptors_are_told_by_name_and_by_being_open(
    method: str, raw_fd: tuple[int, Path]
) -> None:
    fd, _ = raw_fd
    read_end, write_end = os.pipe()
    os.close(write_end)
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    dataset = Holder(
        length=5,
        n=fd,  # an open descriptor's number, under an ordinary name
        count=3,
        stdin_fd=0,
        stale_fd=closed,  # named like one, but not open
        options={"fileno": read_end, "size": fd},
        reader=functools.partial(os.pread, fd),
    )
    try:
        report = check(dataset, num_workers=2, multiprocessing_context=method)
    finally:
        os.close(read_end)
    assert problems(report) == [("raw-fd", Severity.WARNING, "dataset.options['fileno']")]
    finding = report.warnings[0]
    assert f"fd {read_end}, pipe:[" in finding.what
    assert "<function that opens it>" in finding.fix


# --- CUDA -------------------------------------------------------------------------------------


def test_cuda_initialized_is_only_info_without_cuda_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    report = check(list(range(8)), num_workers=2, multiprocessing_context="fork")
    assert [(f.code, f.severity) for f in report.findings] == [("cuda-before-fork", Severity.INFO)]
    assert report.ok  # a model on the GPU and CPU-only workers: torch's everyday case
    assert check(list(range(8)), num_workers=2, multiprocessing_context="spawn").findings == ()


def test_cuda_tensor_in_dataset_is_an_error_under_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")

    class FakeCuda(torch.Tensor):  # a CPU-only build cannot make a real one
        @property
        def is_cuda(self) -> bool:
            return True

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    dataset = Holder(table=torch.zeros(4, 3).as_subclass(FakeCuda))
    report = check(dataset, num_workers=2, multiprocessing_context="fork")
    assert problems(report) == [("cuda-before-fork", Severity.ERROR, "dataset.table")]
    assert "multiprocessing_context='spawn' or 'forkserver'" in report.errors[0].fix
    assert check(dataset, num_workers=2, multiprocessing_context="spawn").ok


# --- ordinary datasets: no warning, no error ---------------------------------------------


class ArrayBacked:
    def __init__(self) -> None:
        self.images = np.zeros((256, 3, 8, 8), dtype=np.float32)
        self.labels = np.arange(256)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return self.images[index], self.labels[index]


def ordinary_datasets() -> list[Any]:
    datasets: list[Any] = [
        list(range(1000)),
        ArrayBacked(),
        Holder(paths=[f"/data/train/{i:07d}.jpg" for i in range(50_000)]),
    ]
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None:
        torch = sys.modules["torch"]
        datasets.append(torch_data.TensorDataset(torch.zeros(64, 3), torch.arange(64)))
    return datasets


@pytest.mark.parametrize("method", ALL)
def test_ordinary_datasets_have_no_warning_or_error(method: str) -> None:
    pytest.importorskip("torch.utils.data")
    for dataset in ordinary_datasets():
        report = check(dataset, num_workers=2, multiprocessing_context=method)
        assert report.ok and not report.errors and not report.warnings, report
        loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context=method)
        assert automatic_findings(loader._config) == []


# --- the walk is bounded and never raises --------------------------------------------------


def test_walk_samples_huge_containers() -> None:
    walk = Walk([("dataset", list(range(1_000_000)))])
    assert walk.examined <= MAX_ITEMS
    assert [path for path, _ in walk.containers] == ["dataset"]
    nested = Holder(rows=[[i, str(i), {"k": i}] for i in range(1_000_000)])
    walk = Walk([("dataset", nested)])  # 1 + 100 rows + 300 of their items + 100 dicts' values
    assert walk.examined <= MAX_ITEMS * 5 + 1


def test_walk_stops_at_its_budget_and_depth() -> None:
    wide = Holder(items=[Holder(more=[Holder(x=i) for i in range(100)]) for _ in range(100)])
    walk = Walk([("dataset", wide)])
    assert walk.truncated and walk.examined == MAX_OBJECTS
    chain: Any = Holder()
    for _ in range(50):
        chain = Holder(next=chain, fh=None)
    walk = Walk([("dataset", chain)])
    assert walk.examined <= 2 * (MAX_DEPTH + 1)


def test_walk_survives_cycles_and_hostile_objects(binary_file: Any) -> None:
    class Hostile:
        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError("no attribute for you")

        def __len__(self) -> int:
            raise RuntimeError("no length either")

    class Lazy:
        def __getattr__(self, name: str) -> Any:
            return Lazy()  # every attribute exists, forever

    dataset = Holder(hostile=Hostile(), lazy=Lazy(), fh=binary_file)
    dataset.me = dataset
    dataset.ring = [dataset, {"back": dataset}]
    walk = Walk([("dataset", dataset)])
    assert [path for path, _ in walk.handles] == ["dataset.fh"]
    report = check(dataset, num_workers=1, multiprocessing_context="fork")
    assert problems(report) == [("shared-file-handle", Severity.WARNING, "dataset.fh")]


def test_walk_sees_slots_partials_and_cursors(sqlite_file: sqlite3.Connection) -> None:
    class Slotted:
        __slots__ = ("__private", "cursor")

        def __init__(self) -> None:
            self.cursor = sqlite_file.cursor()
            self.__private = 1

    def transform(x: int, *, db: Any) -> int:
        return x

    other = sqlite3.connect(":memory:")
    dataset = Holder(s=Slotted(), t=functools.partial(transform, db=Db(other)))
    try:
        walk = Walk([("dataset", dataset)])
    finally:
        dataset.s.cursor.close()
        other.close()
    assert [path for path, _ in walk.handles] == [
        "dataset.s.cursor.connection",
        "dataset.t.keywords['db'].conn",
    ]


# --- environment ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("open_now", "severity"),
    [
        (900, Severity.ERROR),  # 900 + 8 x 32 + 1 > 1024: the running workers do not fit
        (767, Severity.WARNING),  # 767 + 8 x 32 + 1 = 1024 fits, with no margin left
        (752, None),  # 752 + 8 x 32 + 16 = 1024: fits with the margin
    ],
)
def test_low_open_file_limit(
    monkeypatch: pytest.MonkeyPatch, open_now: int, severity: Severity | None
) -> None:
    monkeypatch.setattr(environment, "open_files", lambda: (open_now, 1024, 65536))
    findings = environment.fd_findings(num_workers=32)
    if severity is None:
        assert findings == []
        return
    [finding] = findings
    assert (finding.code, finding.severity, finding.where) == (
        "open-file-limit",
        severity,
        ENVIRONMENT,
    )
    assert "ulimit -n" in finding.fix and "RLIMIT_NOFILE" in finding.fix
    assert environment.fd_findings(num_workers=4) == []
    monkeypatch.setattr(environment, "open_files", lambda: (open_now, 1024, 1024))
    most = (1024 - open_now - environment.FD_MARGIN) // environment.FDS_PER_WORKER
    assert f"at most {most} workers" in environment.fd_findings(num_workers=32)[0].fix


def test_cpu_quota_below_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "cpus", lambda: Cpus(affinity=16, quota=2.0))
    [finding] = environment.cpu_findings(8, automatic=True)  # torch's own check is silent
    assert finding.code == "too-many-workers"
    assert finding.what == "8 workers for 2 usable CPUs"
    assert finding.why.startswith("This container's CPU quota is 2 of the 16 CPUs.")
    monkeypatch.setattr(environment, "cpus", lambda: Cpus(affinity=2))
    assert environment.cpu_findings(8, automatic=True) == []  # torch already warns
    assert [f.code for f in environment.cpu_findings(8)] == ["too-many-workers"]
    assert environment.cpu_findings(2) == []


def test_cgroup_v2_limits_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    job = tmp_path / "fs" / "job"
    job.mkdir(parents=True)
    (job / "cpu.max").write_text("150000 100000\n")
    (job / "memory.max").write_text(f"{4 << 30}\n")
    (job / "memory.current").write_text(f"{3 << 30}\n")
    (job / "memory.stat").write_text(f"anon 1\ninactive_file {1 << 30}\n")
    monkeypatch.setattr(environment, "_PROC_CGROUP", proc)
    monkeypatch.setattr(environment, "_CGROUP", tmp_path / "fs")
    assert environment.cgroup_memory() == (4 << 30, 2 << 30)
    assert environment.cpus().quota == 1.5


def test_prefetch_that_does_not_fit_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    class Big:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> Any:
            return np.zeros(1 << 20, dtype=np.uint8)  # 1 MiB

    monkeypatch.setattr(environment, "available_memory", lambda: (8 << 20, "available"))
    loader = DataLoader(Big(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    report = check(loader)  # 2 workers x 2 prefetched + 1 batches of 2 MiB = 10 MiB
    assert problems(report) == [("low-memory", Severity.WARNING, ENVIRONMENT)]
    assert "10.0 MB" in report.warnings[0].what
    assert check(loader, num_workers=1).ok  # 3 batches: 6 MiB


# --- reports -----------------------------------------------------------------------------------


def test_finding_message_reads_what_where_why_fix() -> None:
    finding = Finding("shared-sqlite", Severity.ERROR, "dataset.db", "What", "Why.", "fix it.")
    assert finding.message() == "What (at dataset.db). Why. Fix: fix it."
    env = Finding("open-file-limit", Severity.WARNING, ENVIRONMENT, "What", "Why.", "fix.")
    assert env.message() == "What (in the environment). Why. Fix: fix."


def test_report_groups_by_severity(binary_file: Any, sqlite_file: sqlite3.Connection) -> None:
    dataset = Holder(fh=binary_file, db=Db(sqlite_file), paths=list(range(200_000)))
    report = check(dataset, num_workers=2, multiprocessing_context="fork")
    assert report.codes() == ["shared-sqlite", "shared-file-handle", "large-python-container"]
    assert [f.code for f in report.errors] == ["shared-sqlite"]
    text = str(report)
    assert text.splitlines()[0].endswith("1 error, 2 warnings.")
    assert text.index("\nERROR\n") < text.index("\nWARNINGS\n")
    assert "  1. dataset.db.conn  [shared-sqlite]" in text
    assert "no problems found" in str(check([1, 2, 3], num_workers=1))


def test_report_and_findings_are_frozen() -> None:
    report = check([1, 2, 3], num_workers=1)
    with pytest.raises(AttributeError):
        report.findings = ()  # type: ignore[misc]
    assert Severity.ERROR > Severity.WARNING > Severity.INFO


def test_check_arguments(binary_file: Any) -> None:
    loader = DataLoader(Holder(fh=binary_file), num_workers=2, multiprocessing_context="spawn")
    assert check(loader).codes() == ["unpicklable"]
    assert check(loader, multiprocessing_context="fork").codes() == ["shared-file-handle"]
    assert check(loader, num_workers=0).findings == ()  # nothing crosses a process boundary
    with pytest.raises(ConfigError, match="'vfork'"):
        check(loader, multiprocessing_context="vfork")
    assert conveyor.check is check


@pytest.mark.slow  # a Python process of its own (about 3 s)
def test_check_does_not_fix_the_default_start_method() -> None:
    # multiprocessing.get_context() would: a later set_start_method() then raises.
    code = (
        "import multiprocessing, conveyor; conveyor.check([1, 2, 3]); "
        "assert multiprocessing.get_start_method(allow_none=True) is None; "
        "multiprocessing.set_start_method('spawn')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("multiprocessing.queues", "QueueFeederThread"),  # multiprocessing.Queue's feeder
        # Lightning's _ChildProcessObserver under strategy="ddp": the framework's, not the
        # user's hazard.
        ("lightning.fabric.strategies.launchers.subprocess_script", "child-process-observer"),
    ],
)
def test_known_tool_threads_are_not_reported(module: str, name: str) -> None:
    stop = threading.Event()

    def _feed() -> None:
        stop.wait()

    _feed.__module__ = module
    feeder = threading.Thread(target=_feed, name=name, daemon=True)
    feeder.start()
    try:
        assert fork_hazards.running_threads() == []
    finally:
        stop.set()
        feeder.join()


def test_a_thread_past_its_target_is_not_reported() -> None:
    # torch's loader's queue feeder threads end just after it stops: one that has
    # returned from its target (Thread.run then drops it) may still be listed, briefly.
    stop = threading.Event()
    feeder = threading.Thread(target=stop.wait, name="QueueFeederThread", daemon=True)
    feeder.start()
    try:
        assert fork_hazards.running_threads() == [feeder]  # a target of nobody's we know
        feeder._target = None  # type: ignore[attr-defined]  # as when Thread.run dropped it
        assert fork_hazards.running_threads() == []
    finally:
        stop.set()
        feeder.join()


def test_a_known_thread_ending_while_it_is_looked_at_is_not_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The feeder thread of torch's last loader returns from its target between the
    check's reads of it (a CI rehearsal: the warning named 'QueueFeederThread')."""
    stop = threading.Event()

    def _feed() -> None:
        stop.wait()

    _feed.__module__ = "multiprocessing.queues"
    feeder = threading.Thread(target=_feed, name="QueueFeederThread", daemon=True)
    feeder.start()

    def ending(thing: Any, name: str, *default: Any) -> Any:
        value = getattr(thing, name, *default)
        if thing is feeder and name == "_target":
            feeder._target = None  # type: ignore[attr-defined]  # Thread.run drops it now
        return value

    monkeypatch.setattr(fork_hazards, "getattr", ending, raising=False)
    try:
        assert fork_hazards.running_threads() == []
    finally:
        stop.set()
        feeder.join()


def test_a_thread_subclass_is_known_by_its_class_module() -> None:
    stop = threading.Event()
    observer_class = type("_ChildProcessObserver", (threading.Thread,), {})
    observer_class.__module__ = "lightning.fabric.strategies.launchers.subprocess_script"
    observer = observer_class(target=stop.wait, name="child-process-observer", daemon=True)
    observer.start()
    try:
        assert fork_hazards.running_threads() == []
    finally:
        stop.set()
        observer.join()


def test_preflight_option_is_strict_and_idle_without_workers(binary_file: Any) -> None:
    with pytest.raises(ConfigError, match="preflight must be True or False"):
        DataLoader([1, 2], preflight="no")  # type: ignore[arg-type]
    loader = DataLoader(Holder(fh=binary_file), batch_size=None)
    assert list(loader) == [0, 1, 2, 3]  # no workers: nothing is shared, no warning
    assert issubclass(conveyor.PreflightWarning, conveyor.ConveyorWarning)
