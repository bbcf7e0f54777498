"""Ctrl-C and the loader: hold it back while a step that must not be cut in half runs
(starting a worker process, tearing workers down), then act on it; and remember that one
passed through a loader (:func:`note_interrupt`): the user wants out, so the
interpreter's exit waits for thread workers a second at most (thread_exit.py), whether
the script caught the ``KeyboardInterrupt`` (as Lightning does, to tear down) or not."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["interrupted", "interrupts_deferred", "note_interrupt"]

_interrupted = False  # a KeyboardInterrupt passed through a loader of this process


def note_interrupt() -> None:
    """A ``KeyboardInterrupt`` is passing through a loader's iteration (caught later or
    not, it means the user wants out)."""
    global _interrupted
    _interrupted = True


def interrupted() -> bool:
    """Whether a ``KeyboardInterrupt`` has passed through a loader of this process."""
    return _interrupted


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C back until the block is done, then act on it as the program's own
    SIGINT handler would (``KeyboardInterrupt`` by default), with the frame where it
    arrived. Python runs signal handlers in the main thread only; elsewhere the block
    just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[FrameType | None] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(frame)

    if signal.getsignal(signal.SIGINT) is None:  # installed from C: not ours to swap
        yield
        return
    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[-1])
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)
