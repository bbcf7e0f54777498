"""Shared fixtures of the fault tests: every start method, and a leak check after each test."""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.faults import START_METHODS
from tests.helpers.leaks import LeakSnapshot, assert_no_leaks

_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.fixture(
    params=[
        pytest.param(method, marks=pytest.mark.slow) if method == "spawn" else method
        for method in START_METHODS
    ]
)
def start_method(request: pytest.FixtureRequest) -> str:
    """Every start method. Spawn workers are the slowest to start and receive their
    objects pickled like forkserver's: the default run covers fork and forkserver,
    ``-m slow`` (CI) adds spawn."""
    return str(request.param)


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
