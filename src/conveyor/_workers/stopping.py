"""The first step of teardown: ask every worker to stop, and let it.

A worker runs its tasks in order and reads ``Stop`` after the last one already in its
pipe; a worker that runs ahead has many there. Left alone, it can also block writing a
batch into a result pipe nobody reads any more, or never get its ``Stop`` because the
task pipe is full. Either way it would only go when terminated, after the whole grace
period (2 s with every ``break``). So, until each worker has exited or the grace is over:
tasks not yet written are dropped (nobody wants their batches now), what workers still
send is read and dropped, and a ``Stop`` waiting for room is written as the pipe drains.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from .outbox import Outbox
from .protocol import Stop


@dataclass(frozen=True)
class Stopping:
    """One worker being stopped: its process, its result pipe, its task outbox."""

    process: BaseProcess
    results_fd: int
    outbox: Outbox


def ask_to_stop(workers: Sequence[Stopping], grace: float) -> None:
    """Send each worker ``Stop`` and wait up to ``grace`` seconds for all to exit."""
    deadline = time.monotonic() + grace
    with selectors.DefaultSelector() as selector:
        for worker in workers:
            worker.outbox.clear()
            with contextlib.suppress(OSError, ValueError):  # already gone
                worker.outbox.send(Stop())
            if worker.process.exitcode is not None:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                selector.register(worker.process.sentinel, selectors.EVENT_READ, worker)
                selector.register(worker.results_fd, selectors.EVENT_READ, worker)
                if worker.outbox.pending:
                    selector.register(worker.outbox.fd, selectors.EVENT_WRITE, worker)
        while any(w.process.exitcode is None for w in workers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for key, _ in selector.select(remaining):
                if key.fd == key.data.results_fd:
                    _drop_what_arrived(selector, key)
                elif key.fd == key.data.outbox.fd:
                    _write_queued(selector, key)
                else:  # a sentinel: the worker exited
                    selector.unregister(key.fileobj)


def _drop_what_arrived(selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    try:
        chunk = os.read(key.fd, 1 << 16)
    except BlockingIOError:
        return
    except OSError:
        chunk = b""
    if not chunk:  # the worker closed its end
        selector.unregister(key.fileobj)


def _write_queued(selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    try:
        done = key.data.outbox.flush()
    except OSError:  # the worker is gone
        done = True
    if done:
        selector.unregister(key.fileobj)
