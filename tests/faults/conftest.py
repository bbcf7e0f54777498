"""Shared fixtures of the fault tests: every start method, and a leak check after each test."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.faults import START_METHODS
from tests.helpers.leaks import LeakSnapshot, assert_no_leaks

_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.fixture(
    params=[
        pytest.param(method, marks=pytest.mark.slow) if method != "fork" else method
        for method in START_METHODS
    ]
)
def start_method(request: pytest.FixtureRequest) -> str:
    """Every start method. The default run covers fork (the quickest to start); spawn
    and forkserver workers receive their objects pickled and start slower, so their
    variants run with ``-m slow``, which CI runs too."""
    return str(request.param)


_SLOW_METHODS = frozenset({"spawn", "forkserver"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A fault test's spawn and forkserver variants run with ``-m slow`` (CI runs both
    selections): their workers start slower and receive their objects pickled, which
    the fork variants of the same test do not exercise, but cost most of the time."""
    here = Path(__file__).parent
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        method = params.get("start_method", params.get("method"))
        if method in _SLOW_METHODS and here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


@pytest.fixture(autouse=True)
def leak_check(request: pytest.FixtureRequest) -> Iterator[LeakSnapshot]:
    """Fail a test that leaves a process, a conveyor memfd or a /dev/shm file behind.

    Runs after the test function has returned, so its loaders, iterators and
    batches are gone; processes get up to 5 s to exit. Skipped when the test
    itself failed (or failed as expected): its traceback, kept for the report,
    still holds the loader.
    """
    before = LeakSnapshot.take()
    yield before
    report = request.node.stash.get(_CALL_REPORT, None)
    if report is not None and report.passed:
        assert_no_leaks(before)
