"""Ctrl-C in the loop, then Ctrl-C again while teardown waits for busy workers; the
program catches KeyboardInterrupt and carries on (a notebook, a script that saves on
Ctrl-C). Prints what is left then: worker processes alive, conveyor memfds open."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import psutil

from conveyor import DataLoader
from conveyor._workers import pool as pool_module


class Busy:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index >= 2:
            time.sleep(30)  # busy: it will not read Stop for a long while
        return index


def ctrl_c(*_: Any) -> None:
    os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, as a terminal sends


original_wait = pool_module._wait_for_exit


def wait_interrupted(processes: Any, grace: float) -> None:
    pool_module._wait_for_exit = original_wait
    ctrl_c()  # the second Ctrl-C comes while teardown waits for the busy workers
    original_wait(processes, grace)


def main() -> None:
    loader = DataLoader(Busy(), batch_size=2, num_workers=2, multiprocessing_context=sys.argv[1])
    it = iter(loader)
    next(it)
    stats = loader.statistics()
    assert stats is not None
    workers = [psutil.Process(w.pid) for w in stats.workers if w.pid is not None]
    pool_module._wait_for_exit = wait_interrupted
    signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0.3)  # the first Ctrl-C, while next() waits
    caught = 0
    try:
        for _ in it:
            pass
    except KeyboardInterrupt:
        caught += 1
    alive = [p.pid for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    fds = [
        name
        for name in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{name}")
        and os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:conveyor")
    ]
    print(json.dumps({"caught": caught, "alive": alive, "memfds": len(fds)}), flush=True)


if __name__ == "__main__":
    main()
