"""A child program for the teardown tests: a slow loader whose worker pids it prints.

Usage: ``python slow_loader.py START_METHOD [thread]``. Iterates a slow, endless loader
with two workers (``thread``: in a thread of its own, which starts the workers, while
the main thread waits for it); once both workers have delivered a sample it prints
``PIDS <pid> <pid>`` and then goes on iterating until it is interrupted or killed.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from conveyor import DataLoader


class SlowPids:
    """Each sample is the pid of the worker that fetched it, after a short nap."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> int:
        time.sleep(0.02)
        return os.getpid()


def iterate() -> None:
    loader = DataLoader(
        SlowPids(), batch_size=None, num_workers=2, multiprocessing_context=sys.argv[1]
    )
    pids: set[int] = set()
    for pid in loader:
        if len(pids) < 2:
            pids.add(int(pid))
            if len(pids) == 2:
                print("PIDS", *sorted(pids), flush=True)


def main() -> None:
    if sys.argv[2:] != ["thread"]:
        iterate()
        return
    thread = threading.Thread(target=iterate, daemon=True)
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
