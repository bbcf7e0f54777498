"""Shared fixtures of the fault tests: every start method, and a leak check after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.leaks import LeakSnapshot, assert_no_leaks

START_METHODS = ("fork", "spawn", "forkserver")


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def leak_check() -> Iterator[LeakSnapshot]:
    """Fail a test that leaves a process, a conveyor memfd or a /dev/shm file behind.

    Runs after the test function has returned, so its loaders, iterators and
    batches are gone; processes get up to 5 s to exit.
    """
    before = LeakSnapshot.take()
    yield before
    assert_no_leaks(before)
