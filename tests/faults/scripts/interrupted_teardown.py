"""Ctrl-C in the loop, then Ctrl-C again while teardown waits for busy workers; the
program catches KeyboardInterrupt, keeps it (as a notebook does) and carries on.

Usage: ``python interrupted_teardown.py START_METHOD``. Both interrupts are real
SIGINTs: the first from a timer while ``next()`` waits, the second sent from inside
teardown's wait for the busy workers. The program's own SIGINT handler notes, for
each, whether it arrived during teardown (the frame Python interrupted is inside
the pool's ``_teardown``) and which workers were still running when the handler
ran. Prints one JSON line: those notes, the KeyboardInterrupts caught, the worker
processes alive then, and every file descriptor opened since the loader was made
and still open (memfds, pipes, sockets: anything).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import psutil
from tests.helpers.interrupts import in_pool_teardown, open_fds

from conveyor import DataLoader
from conveyor._workers import teardown as teardown_steps


class Busy:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index >= 2:
            time.sleep(30)  # busy: it will not read Stop for a long while
        return index


def ctrl_c(*_: Any) -> None:
    os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, as a terminal sends


original_wait = teardown_steps._wait_for_stop


def wait_interrupted(*args: Any) -> None:
    teardown_steps._wait_for_stop = original_wait
    ctrl_c()  # the second Ctrl-C comes while teardown waits for the busy workers
    original_wait(*args)


def running(processes: list[psutil.Process]) -> list[int]:
    return [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def main() -> None:
    method = sys.argv[1]
    # Start multiprocessing's helpers (a fork server, the resource tracker: they live
    # as long as the interpreter) before the snapshot.
    assert [b.item() for b in DataLoader([0], num_workers=1, multiprocessing_context=method)] == [0]
    gc.collect()
    before = open_fds()
    loader = DataLoader(Busy(), batch_size=2, num_workers=2, multiprocessing_context=method)
    it = iter(loader)
    next(it)
    stats = loader.statistics()
    assert stats is not None
    workers = [psutil.Process(w.pid) for w in stats.workers if w.pid is not None]
    sigints: list[dict[str, Any]] = []

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        sigints.append({"in_teardown": in_pool_teardown(frame), "running": len(running(workers))})
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    teardown_steps._wait_for_stop = wait_interrupted
    signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0.3)  # the first Ctrl-C, while next() waits
    caught = 0
    kept: BaseException | None = None
    try:
        for _ in it:
            pass
    except KeyboardInterrupt as exc:
        caught += 1
        kept = exc  # a notebook keeps it (sys.last_value), traceback and all
    del it, loader
    gc.collect()
    after = open_fds()
    new_fds = sorted(f"{fd} -> {path}" for fd, path in after.items() if before.get(fd) != path)
    report = {
        "caught": caught,
        "kept": kept is not None,
        "sigints": sigints,
        "alive": running(workers),
        "fds": new_fds,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
