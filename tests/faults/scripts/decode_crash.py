"""A child program for the fault matrix: the main process dies while it rebuilds a batch.

Usage: ``python decode_crash.py START_METHOD HOW``. Sample 3 pickles in the worker,
but rebuilding it calls ``os.kill(<this process>, SIGKILL)``, ``ctypes.string_at(0)``
(SIGSEGV) or ``os._exit(3)`` (``HOW``: SIGKILL, SIGSEGV, exit3). Prints
``PIDS <worker pid> ...`` once the workers run, then the first batch, then dies
decoding the second.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
from typing import Any

from conveyor import DataLoader


class DiesWhenRebuilt:
    """Pickles fine; unpickling it ends the process that does (the main process)."""

    def __init__(self, how: str, main_pid: int) -> None:
        self.how = how
        self.main_pid = main_pid

    def __reduce__(self) -> tuple[Any, ...]:
        if self.how == "SIGKILL":
            return (os.kill, (self.main_pid, signal.SIGKILL))
        if self.how == "SIGSEGV":
            return (ctypes.string_at, (0,))
        return (os._exit, (3,))


class Samples:
    def __init__(self, how: str) -> None:
        self.how = how
        self.main_pid = os.getpid()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        return DiesWhenRebuilt(self.how, self.main_pid) if index == 3 else index


def main() -> None:
    method, how = sys.argv[1], sys.argv[2]
    faulthandler.disable()  # keep the SIGSEGV quiet
    loader = DataLoader(
        Samples(how), batch_size=2, num_workers=2, collate_fn=list, multiprocessing_context=method
    )
    it = iter(loader)
    stats = loader.statistics()
    assert stats is not None
    print("PIDS", *(w.pid for w in stats.workers), flush=True)
    for batch in it:
        print(batch, flush=True)


if __name__ == "__main__":
    main()
