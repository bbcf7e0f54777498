"""The tests' own leak check for /dev/shm (tests/helpers/leaks.py): a file this test
leaves is named; one that goes within the check's timeout is not (another test's,
unlinked by its resource tracker after its process died)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers import leaks


@pytest.fixture
def shm_file() -> Iterator[Path]:
    path = Path(leaks.SHM_DIR) / f"conveyor-leak-check-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)


def test_a_file_left_in_dev_shm_is_named(shm_file: Path) -> None:
    before = leaks.LeakSnapshot.take()
    shm_file.write_bytes(b"x")
    # (in this test's name: a test beside it, in another xdist worker, may leave its own)
    assert shm_file.name in leaks.new_shm_entries(before, timeout=0.5)


def test_a_file_that_goes_within_the_timeout_is_not(shm_file: Path) -> None:
    before = leaks.LeakSnapshot.take()
    shm_file.write_bytes(b"x")
    gone = threading.Timer(0.3, os.unlink, (shm_file,))
    gone.start()
    try:
        assert shm_file.name not in leaks.new_shm_entries(before, timeout=30.0)
    finally:
        gone.join()
