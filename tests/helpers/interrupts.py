"""What the Ctrl-C tests look at: where a signal landed, and what descriptors are open.

Used by tests in this process and by the child programs in ``tests/faults/scripts``
(started with :data:`CHILD_ENV`, which puts the repository root on their path).
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import weakref
from pathlib import Path
from types import FrameType
from typing import Any

from conveyor._workers import pool as pool_module

ROOT = Path(__file__).resolve().parents[2]
CHILD_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}


def in_pool_teardown(frame: FrameType | None) -> bool:
    """Whether Python was running the worker pool's teardown where a signal arrived."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_teardown" and code.co_filename == pool_module.__file__:
            return True
        frame = frame.f_back
    return False


def open_fds() -> dict[int, str]:
    """Every descriptor this process holds, and what it points to (pipes and sockets
    included)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir used
            continue
    return found


class _Link:
    """Holds one object. When a _Link dies, its weak references' callbacks run before its
    attributes are let go: so a chain of them runs each link's callback in order, then
    frees what the last one holds, all in C."""

    held: Any


class CtrlCAsItDies:
    """Holds ``victim`` (give up every other reference to it): when this holder is
    dropped, a real SIGINT reaches this process just before ``victim`` dies, and this
    thread runs no Python bytecode between the two, so the signal's Python handler runs
    at the first bytecode after: inside a weak reference callback of ``victim``'s, if it
    has one written in Python, or in the code that dropped the holder.

    How: the holder is a chain of two links. The first's weak reference callback wakes a
    helper thread; the second's blocks this thread (both are C methods of queues). The
    helper raises SIGINT in itself (so the kernel delivers it there, not here), then
    unblocks this thread, which goes on to free ``victim``."""

    def __init__(self, victim: object) -> None:
        self._woken: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._gate: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.holder, last = _Link(), _Link()
        self.holder.held, last.held = last, victim
        self._callbacks = (
            weakref.ref(self.holder, self._woken.put),
            weakref.ref(last, self._gate.get),  # blocks until the helper puts
        )
        self._helper = threading.Thread(target=self._interrupt, daemon=True)
        self._helper.start()

    def _interrupt(self) -> None:
        if self._woken.get(timeout=60) is None:
            return  # released without being dropped (see close)
        signal.raise_signal(signal.SIGINT)
        self._gate.put(None)

    def drop(self) -> KeyboardInterrupt | None:
        """Drop the holder under Python's own SIGINT handler: the KeyboardInterrupt as
        the code that dropped it goes on (at its next call), or None if it never came
        there (raised where Python prints it as ignored). The program's handler is put
        back and the helper joined."""
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            del self.holder  # the victim dies, a real SIGINT just before
            _first_call_after()
        except KeyboardInterrupt as interrupt:
            return interrupt
        finally:
            signal.signal(signal.SIGINT, before)
            self.close()
        return None

    def close(self) -> None:
        """Wait for the helper (tell it to stop if the holder was never dropped)."""
        if self._helper.is_alive() and getattr(self, "holder", None) is not None:
            self._woken.put(None)
        self._helper.join(60)


def _first_call_after() -> None:
    """A Python call: a pending signal's handler runs as it starts."""
