"""Ctrl-C at every moment of a loader's start-up and first epoch, one run per delay.

Usage: ``python interrupt_sweep.py START_METHOD STEP_S UNTIL_S``. For each delay from 0
to ``UNTIL_S`` every ``STEP_S``: a loader of two workers (its start-up, then an epoch of
slow samples, longer than ``UNTIL_S`` in all), a real SIGINT sent to this process that
many seconds after ``iter()`` is called, the KeyboardInterrupt caught and kept (as a
notebook keeps the last exception, traceback and all). After each run, prints one JSON
line: the delay, where the interrupt landed, the processes started since the sweep
began that are still running, every descriptor (pipes included) opened since and still
open, new files in /dev/shm, and conveyor's shared memory still mapped here once the
kept exception is dropped (a batch its frames hold keeps its memory while it lives).

multiprocessing's own helpers (the resource tracker, a fork server) are started before
the first snapshot: they live as long as the interpreter, by design, whoever starts them.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time

from tests.helpers import leaks
from tests.helpers.interrupts import open_fds

from conveyor import DataLoader

SAMPLE_S = 0.05  # 64 samples on two workers: an epoch of about 1.6 s past the start-up


class Slow:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        time.sleep(SAMPLE_S)
        return index


def interrupted(method: str, delay: float) -> tuple[str, BaseException | None]:
    """One run: where the SIGINT landed ("iter", "loop", or "after": the epoch had
    ended), and the KeyboardInterrupt, kept."""
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, multiprocessing_context=method)
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))  # a real Ctrl-C
    where = "iter"
    try:
        timer.start()
        for _batch in loader:
            where = "loop"
        where = "after"
        threading.Event().wait(30)  # the SIGINT ends the wait
    except KeyboardInterrupt as exc:
        timer.join()
        return where, exc
    timer.join()
    return where, None


def main() -> None:
    method, step, until = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    # Start multiprocessing's helpers (they live on by design) before the snapshot.
    assert [b.item() for b in DataLoader([0, 1], num_workers=1, multiprocessing_context=method)]
    gc.collect()
    before, fds = leaks.LeakSnapshot.take(), open_fds()
    for i in range(round(until / step) + 1):
        delay = round(i * step, 3)
        where, kept = interrupted(method, delay)  # kept while the leaks are looked for
        gc.collect()
        now = open_fds()
        alive = leaks.new_processes(before)
        report = {
            "delay": delay,
            "where": where,
            "caught": kept is not None,
            "alive": [" ".join(p.cmdline())[:120] for p in alive if leaks.is_alive(p)],
            "fds": sorted(f"{fd} -> {to}" for fd, to in now.items() if fds.get(fd) != to),
            "shm": leaks.new_shm_entries(before),
        }
        kept = None
        gc.collect()
        report["maps"] = len(leaks.memfd_maps() - before.maps)
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
