"""The loop's fake pool as a fourth kind of worker: proof that a kind is a shell around
``WorkerCore`` with its pool (tests/helpers/fake_pool.py) and one registration, this.

Its workers are cores run one task at a time in the test's own thread, their batches
pickled as a pipe would carry them; a loader names it ``worker_method="fake"`` while
:func:`registered` is entered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from conveyor._workers import kinds
from conveyor._workers.kinds import WorkerKind
from tests.helpers.fake_pool import FakePool

FAKE = WorkerKind(
    "fake",
    "in the test's own thread, one task at a time",
    lambda config: FakePool,
    in_this_process=True,  # its cores share this process's objects, as threads do
    tensors_in_main=False,
    no_start_method="the fake pool starts no process",
)


@contextlib.contextmanager
def registered() -> Iterator[WorkerKind]:
    """``worker_method="fake"`` names :data:`FAKE` meanwhile."""
    kinds.register(FAKE)
    try:
        yield FAKE
    finally:
        kinds.unregister(FAKE.name)
