"""The automatic pre-flight with real workers: an ERROR stops the loader before any
worker process starts; a WARNING is emitted once per loader and loading goes on."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from conveyor import ConfigError, DataLoader, PreflightWarning, UnpicklableError, check
from tests.helpers import leaks

pytestmark = pytest.mark.timeout(120)


class HoldsFile:
    """Opens its shard in ``__init__`` (the classic mistake) and reads it per sample."""

    def __init__(self, path: Path, mode: str = "rb") -> None:
        self.fh = open(path, mode)  # noqa: SIM115 - the point: an open file

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> Any:
        self.fh.seek(index)
        return self.fh.read(1)

    def close(self) -> None:
        self.fh.close()


class HoldsDb:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.db = _Db(conn)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


class _Db:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


class Transformed:
    """A dataset holding a lambda: cloudpickle sends it to spawn workers."""

    def __init__(self) -> None:
        self.transform = lambda x: x * 10

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return int(self.transform(index))


class Noisy:
    """Makes its random generator in ``__init__`` (so every worker starts it the same)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return int(self.rng.integers(1 << 30))


class ManyPaths:
    def __init__(self) -> None:
        self.paths = [f"/data/{i:07d}.jpg" for i in range(200_000)]

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        return self.paths[index]


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "shard.bin"
    path.write_bytes(bytes(range(6)))
    return path


@pytest.fixture
def db_file(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "index.sqlite")
    yield conn
    conn.close()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _preflight(record: pytest.WarningsRecorder) -> list[Any]:
    return [w for w in record if issubclass(w.category, PreflightWarning)]


# --- warnings: once per loader, and loading goes on -------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_shared_file_warns_once_per_loader(shard: Path, persistent: bool) -> None:
    dataset = HoldsFile(shard)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=1,
        multiprocessing_context="fork",
        persistent_workers=persistent,
    )
    try:
        with leaks.no_leaks():
            with pytest.warns(PreflightWarning) as record:
                first = list(loader)
            second = list(loader)  # a second warning would fail the test (filterwarnings)
            del loader
    finally:
        dataset.close()
    [warning] = _preflight(record)
    assert warning.filename == __file__  # points at the user's loop, not at conveyor
    finding = warning.message.finding
    assert (finding.code, finding.where) == ("shared-file-handle", "dataset.fh")
    assert "conveyor.per_worker(open, " in str(warning.message)
    assert first == second == [bytes([i]) for i in range(6)]  # one worker: no race


def test_text_file_under_spawn_warns_and_workers_get_a_copy(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("abcdef")
    dataset = HoldsFile(path, "r")
    loader = DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    try:
        with pytest.warns(PreflightWarning, match="copy of its contents") as record:
            items = list(loader)
    finally:
        dataset.close()
    assert [w.message.finding.code for w in _preflight(record)] == ["file-copied"]
    assert items == list("abcdef")


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_large_list_warns_and_loads(method: str) -> None:
    loader = DataLoader(ManyPaths(), batch_size=2, num_workers=1, multiprocessing_context=method)
    with pytest.warns(PreflightWarning, match="200,000 Python objects") as record:
        batches = list(loader)
    assert [w.message.finding.where for w in _preflight(record)] == ["dataset.paths"]
    assert batches[0] == ["/data/0000000.jpg", "/data/0000001.jpg"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_generator_made_in_init_warns_once_on_iter(method: str) -> None:
    loader = DataLoader(Noisy(), batch_size=None, num_workers=2, multiprocessing_context=method)
    with pytest.warns(PreflightWarning, match="same state in every worker") as record:
        it = iter(loader)
    [warning] = _preflight(record)
    assert warning.filename == __file__
    finding = warning.message.finding
    assert (finding.code, finding.where) == ("shared-rng", "dataset.rng")
    assert "info.dataset.rng = np.random.default_rng(info.seed)" in str(warning.message)
    # What it warns about: worker 0 fetches samples 0 and 2, worker 1 samples 1 and 3.
    first = list(it)
    assert first[0] == first[1] and first[2] == first[3]
    assert list(loader) == first  # a second warning would fail the test (filterwarnings)


# The thread is the subject: Python 3.12+ warns of the fork too (re-raised by pytest.warns).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_running_thread_warns_under_fork_only() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="metrics-uploader", daemon=True)
    thread.start()
    try:
        fork = DataLoader([1, 2, 3, 4], batch_size=2, num_workers=1, multiprocessing_context="fork")
        with pytest.warns(PreflightWarning, match="'metrics-uploader'"):
            assert [b.tolist() for b in fork] == [[1, 2], [3, 4]]
        server = DataLoader(
            [1, 2, 3, 4], batch_size=2, num_workers=1, multiprocessing_context="forkserver"
        )
        assert [b.tolist() for b in server] == [[1, 2], [3, 4]]  # the fork server has no threads
    finally:
        stop.set()
        thread.join()


def test_lambda_dataset_under_spawn_is_fine() -> None:
    loader = DataLoader(Transformed(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    assert [b.tolist() for b in loader] == [[0, 10], [20, 30]]  # no warning: that would fail


def test_preflight_false_skips_the_checks(shard: Path) -> None:
    dataset = HoldsFile(shard)
    try:
        loader = DataLoader(
            dataset, batch_size=None, num_workers=1, multiprocessing_context="fork", preflight=False
        )
        assert len(list(loader)) == 6  # no PreflightWarning (it would fail the test)
    finally:
        dataset.close()


# --- errors: raised before any worker process exists -----------------------------------


def test_shared_sqlite_stops_before_workers_start(db_file: sqlite3.Connection) -> None:
    loader = DataLoader(HoldsDb(db_file), num_workers=2, multiprocessing_context="fork")
    before, children = leaks.LeakSnapshot.take(), _children()
    with pytest.raises(ConfigError) as info:
        iter(loader)
    assert _children() == children and leaks.new_processes(before) == []
    assert isinstance(info.value, ValueError)
    assert info.value.finding.code == "shared-sqlite"  # type: ignore[attr-defined]
    message = str(info.value)
    assert "(at dataset.db.conn)" in message
    assert "conveyor.per_worker(sqlite3.connect, " in message
    assert "preflight=False" in "\n".join(info.value.__notes__)
    with pytest.raises(ConfigError):  # checked again: nothing was started
        iter(loader)
    # The escape hatch: the user knows the workers never touch the connection.
    escaped = DataLoader(
        HoldsDb(db_file), batch_size=2, num_workers=1, multiprocessing_context="fork",
        preflight=False,
    )  # fmt: skip
    assert [b.tolist() for b in escaped] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unpicklable_file_stops_before_workers_start(shard: Path, method: str) -> None:
    dataset = HoldsFile(shard)
    loader = DataLoader(dataset, num_workers=2, multiprocessing_context=method)
    before, children = leaks.LeakSnapshot.take(), _children()
    try:
        with pytest.raises(UnpicklableError) as info:
            iter(loader)
        assert _children() == children and leaks.new_processes(before) == []
    finally:
        dataset.close()
    exc = info.value
    assert (exc.path, exc.type_name) == ("dataset.fh", "_io.BufferedReader")
    assert f"start method '{method}'" in str(exc)
    assert exc.finding.code == "unpicklable"  # type: ignore[attr-defined]


@pytest.fixture
def default_start_method() -> Iterator[Callable[[str], None]]:
    """Sets multiprocessing's default start method, as a platform or Python does (Linux's
    is fork up to Python 3.13, forkserver from 3.14); put back afterwards."""
    before = multiprocessing.get_start_method(allow_none=True)
    yield lambda method: multiprocessing.set_start_method(method, force=True)
    multiprocessing.set_start_method(before, force=True)


@pytest.mark.parametrize("default", ["fork", "forkserver"])
def test_the_default_start_method_is_read_at_iter_and_named(
    shard: Path, default: str, default_start_method: Callable[[str], None]
) -> None:
    # Nothing assumes fork is the default: the checks and messages are those of the
    # method the workers will really start with.
    dataset = HoldsFile(shard)
    loader = DataLoader(dataset, batch_size=None, num_workers=1)  # before the default is set
    default_start_method(default)
    try:
        report = str(check(dataset, num_workers=1))
        assert f"start method {default!r}" in report
        if default == "fork":
            assert "[shared-file-handle]" in report and "[unpicklable]" not in report
            with pytest.warns(PreflightWarning, match="shared by the forked workers"):
                assert list(loader) == [bytes([i]) for i in range(6)]
        else:
            assert "[unpicklable]" in report and "forked" not in report
            with pytest.raises(UnpicklableError, match="start method 'forkserver'"):
                iter(loader)
    finally:
        dataset.close()


@pytest.mark.parametrize("preflight", [True, False])
def test_unpicklable_file_error_names_the_real_file(shard: Path, preflight: bool) -> None:
    """The error a user hits at iter() gives the recipe check() gives: the file's own path."""
    dataset = HoldsFile(shard)
    loader = DataLoader(
        dataset, num_workers=1, multiprocessing_context="spawn", preflight=preflight
    )
    try:
        with pytest.raises(UnpicklableError) as info:
            iter(loader)
        [finding] = check(loader).errors
    finally:
        dataset.close()
    recipe = f"conveyor.per_worker(open, {str(shard)!r}, 'rb') in dataset.fh instead"
    assert recipe in str(info.value)
    assert finding.fix in str(info.value)  # one recipe, word for word


def test_cuda_tensor_under_fork_stops_before_workers_start(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")

    class FakeCuda(torch.Tensor):  # a CPU-only build cannot make a real one
        @property
        def is_cuda(self) -> bool:
            return True

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 2).as_subclass(FakeCuda))
    loader = DataLoader(dataset, num_workers=1, multiprocessing_context="fork")
    children = _children()
    with pytest.raises(ConfigError, match="multiprocessing_context='spawn' or 'forkserver'"):
        iter(loader)
    assert _children() == children
