"""The instruments under attack: progress, the epoch's report and the trace never end or
hang a training run. stderr is a real pipe whose reader is gone, or closed; the trace
goes where it cannot be written, or to a full disk (``/dev/full``). A failure is logged
once on the ``conveyor`` logger and training goes on; the user's own exception is never
replaced; an autotuner that cannot add a worker keeps the count it has.
(``statistics()`` asked from another thread while a process dies:
test_threads_per_worker.py.)
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import DataLoader
from conveyor.observe import failsafe
from tests.helpers.interrupts import CHILD_ENV

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).parent / "scripts"
HAVE_TQDM = importlib.util.find_spec("tqdm") is not None


@pytest.fixture(autouse=True)
def instruments_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Instruments that failed stay off in a process: each test starts with all on."""
    monkeypatch.setattr(failsafe, "_off", set())


@contextlib.contextmanager
def broken_stderr() -> Iterator[None]:
    """sys.stderr is a pipe whose reader is gone: every write raises BrokenPipeError.
    (Entered in the test's body: pytest sets its own sys.stderr when the call begins.)"""
    read, write = os.pipe()
    os.close(read)
    stream = open(write, "w")  # noqa: SIM115 (closed below)
    kept, sys.stderr = sys.stderr, stream
    try:
        yield
    finally:
        sys.stderr = kept
        with contextlib.suppress(BrokenPipeError):  # what it buffers cannot go: no reader
            stream.close()


def _hide_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if tqdm were not installed: the plain progress line."""
    find_spec = importlib.util.find_spec

    def without_tqdm(name: str, *args: Any) -> Any:
        return None if name == "tqdm" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_tqdm)


@pytest.fixture
def no_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_tqdm(monkeypatch)


def _train(**options: Any) -> list[int]:
    """Two epochs, every sample of both."""
    loader = DataLoader(list(range(40)), batch_size=4, num_workers=2, **options)
    return [i for _ in range(2) for batch in loader for i in batch.tolist()]


def _failures(caplog: pytest.LogCaptureFixture, instrument: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"the {instrument} failed" in r.getMessage()]


@pytest.mark.skipif(not HAVE_TQDM, reason="tqdm's bar: pip install tqdm")
def test_tqdms_bar_on_a_broken_stderr_does_not_end_training(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="conveyor"), broken_stderr():
        assert _train(progress=True) == list(range(40)) * 2
    [said] = _failures(caplog, "progress display")  # once, for both epochs
    assert "BrokenPipeError" in said


@pytest.mark.usefixtures("no_tqdm")
def test_the_plain_progress_line_on_a_broken_stderr_does_not_end_training(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="conveyor"), broken_stderr():
        assert _train(progress=True) == list(range(40)) * 2
    [said] = _failures(caplog, "progress display")
    assert "BrokenPipeError" in said


def test_the_epochs_report_on_a_broken_stderr_does_not_end_training(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="conveyor"), broken_stderr():
        assert _train(report=True) == list(range(40)) * 2
    [said] = _failures(caplog, "epoch report")
    assert "BrokenPipeError" in said


@pytest.mark.parametrize("tqdm", [True, False])
def test_progress_with_stderr_closed_shows_nothing_and_trains(
    tqdm: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program started with stderr closed has ``sys.stderr = None``: tqdm raised
    AttributeError at iter(), and the plain line went to stdout."""
    if tqdm and not HAVE_TQDM:
        pytest.skip("tqdm's bar: pip install tqdm")
    if not tqdm:
        _hide_tqdm(monkeypatch)
    kept, sys.stderr = sys.stderr, None  # type: ignore[assignment]
    try:
        assert _train(progress=True) == list(range(40)) * 2
    finally:
        sys.stderr = kept
    assert "conveyor" not in capsys.readouterr().out  # stdout is the user's


def test_a_trace_path_that_cannot_be_written_fails_before_the_block(tmp_path: Path) -> None:
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2)
    ran = []
    with (
        pytest.raises(FileNotFoundError, match=r"loader\.trace\(\) cannot write") as caught,
        loader.trace(tmp_path / "no such directory" / "run.json"),
    ):
        ran.append(list(loader))
    assert ran == []  # no training was lost to a path typo
    assert "no such directory" in str(caught.value) and "Fix:" in str(caught.value)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_trace_that_cannot_be_saved_never_replaces_the_users_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """/dev/full opens, and every write to it fails (ENOSPC): a full disk."""
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2)
    with (
        caplog.at_level(logging.ERROR, logger="conveyor"),
        pytest.raises(KeyError, match="mine"),
        loader.trace("/dev/full"),
    ):
        for _ in loader:
            raise KeyError("mine")
    [said] = [r.getMessage() for r in caplog.records if "trace could not be written" in r.msg]
    assert "/dev/full" in said and "No space left on device" in said


@pytest.mark.slow  # a child interpreter
@pytest.mark.parametrize("display", ["tqdm", "plain"])
def test_a_training_script_whose_stderr_reader_is_gone_ends_with_status_0(display: str) -> None:
    if display == "tqdm" and not HAVE_TQDM:
        pytest.skip("tqdm's bar: pip install tqdm")
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "progress_to_nowhere.py"), display],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV,
    )  # fmt: skip
    assert child.stderr is not None
    child.stderr.close()  # the reader is gone (a pager quit, a log collector died)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, out
    assert out.splitlines()[-1] == "trained 20 batches"


class Waits:
    """Each sample waits 4 ms (storage stands in): the autotuner wants more workers."""

    def __len__(self) -> int:
        return 1200

    def __getitem__(self, i: int) -> int:
        threading.Event().wait(0.004)
        return i


@pytest.mark.slow  # lets the autotuner measure for a few seconds
def test_an_autotuner_that_cannot_add_a_worker_keeps_the_count_and_trains(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real open-file limit, reached once the workers run: the worker the autotuner
    adds cannot get its pipes (EMFILE). That ended the run; now the count it has is kept."""
    loader = DataLoader(Waits(), batch_size=8, num_workers="auto", multiprocessing_context="fork")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="conveyor"):
        it = iter(loader)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 2, hard))
        try:
            seen += [i for batch in it for i in batch.tolist()]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert seen == list(range(1200))
    [said] = _failures(caplog, "num_workers='auto' autotuner")
    assert "Too many open files" in said
