"""Fork workers after conveyor's threads have had their turn, in a clean process.

Python 3.12+ warns at each fork of a process that has other threads ("This process
... is multi-threaded, use of fork() may lead to deadlocks in the child"). Each
scenario (named by the first argument) ends with loaders forking their workers in
the main thread; the warnings that those forks raised are printed as JSON. ``control``
forks with a thread of its own running, to show the warning is seen when there is
a reason.

torch is hidden (conveyor then uses NumPy batches): the subject is conveyor's
threads, not those a library may start.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

sys.modules["torch"] = None  # type: ignore[assignment]

import conveyor  # noqa: E402
from conveyor._iter import multiprocess  # noqa: E402


def fork_loader(**kwargs: Any) -> list[int]:
    threads_gone()
    return fork_now(**kwargs)


def fork_now(**kwargs: Any) -> list[int]:
    loader = conveyor.DataLoader(
        list(range(8)), batch_size=4, num_workers=2, multiprocessing_context="fork", **kwargs
    )
    return [int(i) for batch in loader for i in batch]


def threads_gone(timeout: float = 5.0) -> None:
    """Wait until this process has one OS thread (the fork warning counts them). Before
    3.13, join() returns once a thread has run its Python part, a moment before the OS
    thread ends; a thread still running (the bug) is still there after the timeout."""
    deadline = time.monotonic() + timeout
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)


def in_a_thread(work: Callable[[], object]) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def first_epoch_in_a_thread() -> Callable[[], object]:
    in_a_thread(fork_loader)
    return fork_loader


def persistent_workers_started_in_a_thread() -> Callable[[], object]:
    loader = conveyor.DataLoader(
        list(range(8)), batch_size=4, num_workers=2, persistent_workers=True,
        multiprocessing_context="fork",
    )  # fmt: skip
    in_a_thread(functools.partial(list, loader))
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the same workers
    del loader
    return fork_loader


def persistent_loader_alive_after_a_thread_started_it() -> Callable[[], object]:
    """A validation loader's persistent workers, first started by a background thread,
    live on while other loaders fork theirs."""
    loader = conveyor.DataLoader(
        list(range(8)), batch_size=4, num_workers=2, persistent_workers=True,
        multiprocessing_context="fork",
    )  # fmt: skip
    in_a_thread(functools.partial(list, loader))

    def forks() -> None:
        fork_loader()
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # still there
        fork_loader()

    return forks


def pinned_epochs() -> Callable[[], object]:
    # The pin thread pins with a stand-in (no accelerator here), as in test_pin_memory.
    multiprocess.pinning_enabled = lambda config: True  # type: ignore[assignment]
    multiprocess.pin_batch = lambda batch: batch.copy()
    multiprocess.pin_thread_setup = lambda: None  # type: ignore[assignment]
    loader = conveyor.DataLoader(
        list(range(64)), batch_size=4, num_workers=2, pin_memory=True,
        persistent_workers=True, multiprocessing_context="fork",
    )  # fmt: skip
    assert len(list(loader)) == 16  # the epoch ended; the persistent workers stay

    def forks() -> None:
        fork_loader()  # another loader's workers, between two epochs
        assert len(list(loader)) == 16
        fork_loader(pin_memory=True)  # its pin thread stops with its epoch
        fork_loader()

    return forks


def control() -> Callable[[], object]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    return fork_now


def main(scenario: str) -> None:
    warnings.simplefilter("always")  # "error" would not do: CPython drops this warning then
    forks = globals()[scenario]()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        forks()
    print(json.dumps([str(w.message) for w in record if w.category is DeprecationWarning]))


if __name__ == "__main__":
    main(sys.argv[1])
