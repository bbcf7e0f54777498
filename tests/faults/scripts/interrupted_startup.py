"""Ctrl-C while a loader's workers start; the program catches KeyboardInterrupt, keeps
it (as a notebook keeps the last exception, traceback and all) and carries on.

Usage: ``python interrupted_startup.py START_METHOD WHEN``. ``WHEN`` is ``preparing``
(a real SIGINT the moment the first worker's own pipes exist, before its process is
started), ``spawning`` (the moment the first worker process exists, before
multiprocessing has sent it what it needs to run: its start is half done),
``handing_over`` (the moment the pool is made, before the loop holds it: a pool that
nobody holds is a pool nobody stops), ``supervising`` (the moment every worker process
is started, before the loop has taken charge of them), ``starting`` (while ``iter()``
waits for workers that are in ``worker_init_fn``: sent by a thread once a worker said
it is there) or ``restarting`` (sample 3 kills its worker once; the moment the pool has
let the dead worker go, before its replacement is started). Prints one JSON line: how many
KeyboardInterrupts were caught, the processes started since that are still
running, and every file descriptor (pipes included) opened since and still open.
"""

from __future__ import annotations

import gc
import json
import multiprocessing.util
import os
import signal
import sys
import threading
import warnings
from typing import Any

import psutil
from tests.helpers.interrupts import open_fds

from conveyor import DataLoader
from conveyor._iter import multiprocess
from conveyor._workers import pool as pool_module

_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


class Gate:
    """worker_init_fn: writes a byte to the FIFO at ``fifo`` (a path reaches workers
    under every start method), then blocks until the worker is stopped."""

    def __init__(self, fifo: str) -> None:
        self.fifo = fifo

    def __call__(self, worker_id: int) -> None:
        fd = os.open(self.fifo, os.O_WRONLY)
        os.write(fd, b"x")
        os.close(fd)
        threading.Event().wait()  # starting, for as long as it takes


def descendants() -> list[psutil.Process]:
    """Running processes started by this one, but multiprocessing's own helpers (a fork
    server, the resource tracker: started once, they live as long as the interpreter)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(h in " ".join(proc.cmdline()) for h in _HELPERS):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def interrupt_when_spawned() -> None:
    """Send SIGINT right after the first spawned child exists (once)."""
    original = multiprocessing.util.spawnv_passfds

    def spawned(*args: Any) -> int:
        multiprocessing.util.spawnv_passfds = original
        pid = original(*args)
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT: raised at the next bytecode
        return pid

    multiprocessing.util.spawnv_passfds = spawned


def interrupt_when_preparing() -> None:
    """Send SIGINT right after the first worker's stack pipe is made (once): the last of
    the descriptors the main process makes for it before starting its process."""
    original = os.pipe2

    def made(flags: int) -> tuple[int, int]:
        os.pipe2 = original
        fds = original(flags)
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT: raised at the next bytecode
        return fds

    os.pipe2 = made


def interrupt_when_supervising() -> None:
    """Send SIGINT right after the workers' pool is made (once), before the loop builds
    what watches it: the moment a start-up was left unguarded."""
    original = multiprocess.Supervisor

    def supervisor(*args: Any, **kwargs: Any) -> Any:
        multiprocess.Supervisor = original  # type: ignore[misc]
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT: raised at the next bytecode
        return original(*args, **kwargs)

    multiprocess.Supervisor = supervisor  # type: ignore[misc]


def interrupt_when_handing_over() -> None:
    """Send SIGINT right after the pool is made, before its constructor returns it (once)."""
    original = pool_module.WorkerPool.__init__

    def made(self: Any, *args: Any, **kwargs: Any) -> None:
        pool_module.WorkerPool.__init__ = original  # type: ignore[method-assign]
        original(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT: raised at the next bytecode

    pool_module.WorkerPool.__init__ = made  # type: ignore[method-assign]


def interrupt_when_restarting() -> None:
    """Send SIGINT right after the pool let a dead worker go, before it starts the next."""
    original = pool_module.release

    def released(*args: Any) -> None:
        pool_module.release = original
        original(*args)
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT: raised at the next bytecode

    pool_module.release = released


class DiesOnce:
    """Sample 3 kills its worker the first time (the file at ``marker`` says it did)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 3 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return index


def interrupt_when_starting(fifo: str) -> None:
    """A thread: once a worker is in worker_init_fn, send SIGINT to this process."""
    os.mkfifo(fifo)

    def wait_then_interrupt() -> None:
        fd = os.open(fifo, os.O_RDONLY)  # blocks until a worker opens it to write
        os.read(fd, 1)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=wait_then_interrupt, daemon=True).start()


def main() -> None:
    method, when = sys.argv[1], sys.argv[2]
    fifo = os.path.join(sys.argv[3], "started")
    # Start multiprocessing's helpers (they live on by design) before the snapshot.
    loader = DataLoader([0, 1], num_workers=1, multiprocessing_context=method)
    assert [b.item() for b in loader] == [0, 1]
    del loader
    gc.collect()
    before_fds = open_fds()
    before_procs = {p.pid for p in descendants()}
    init = None
    dataset: Any = list(range(8))
    if when == "preparing":
        interrupt_when_preparing()
    elif when == "spawning":
        interrupt_when_spawned()
    elif when == "handing_over":
        interrupt_when_handing_over()
    elif when == "supervising":
        interrupt_when_supervising()
    elif when == "restarting":
        interrupt_when_restarting()
        dataset = DiesOnce(os.path.join(sys.argv[3], "died"))
    else:
        interrupt_when_starting(fifo)
        init = Gate(fifo)
    loader = DataLoader(dataset, num_workers=2, multiprocessing_context=method, worker_init_fn=init)
    caught = 0
    kept: BaseException | None = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the restart's warning
            for _batch in loader:
                pass
    except KeyboardInterrupt as exc:
        caught += 1
        kept = exc  # a notebook keeps it: sys.last_value, with its traceback
    gc.collect()
    alive = [" ".join(p.cmdline())[:120] for p in descendants() if p.pid not in before_procs]
    after = open_fds()
    new_fds = sorted(
        f"{fd} -> {target}" for fd, target in after.items() if before_fds.get(fd) != target
    )
    frames = 0
    tb = kept.__traceback__ if kept is not None else None
    while tb is not None:  # the kept traceback really is there, frames and all
        frames += 1
        tb = tb.tb_next
    print(
        json.dumps({"caught": caught, "frames": frames > 0, "alive": alive, "fds": new_fds}),
        flush=True,
    )


if __name__ == "__main__":
    main()
