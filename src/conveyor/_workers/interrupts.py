"""Ctrl-C and the loader: hold it back while a step that must not be cut in half runs
(starting a worker process, tearing workers down), then act on it; and remember that
the user pressed it (:func:`note_interrupt`): the user wants out, so the interpreter's
exit waits for thread workers a second at most (thread_exit.py), whether the script
caught the ``KeyboardInterrupt`` (as Lightning does, to tear down) or not.

A Ctrl-C is noted where it lands: while thread workers run (:func:`watch_ctrl_c`), the
program's SIGINT handler is wrapped by one that notes it first, so one raised in the
training step, or in the loop's own code between two batches, counts as much as one
raised inside the loader's ``next()`` (the iterator notes those too). The wrapper only
notes, then does what the program's handler does; it goes when the last thread pool
closes, unless the program has put its own handler in since."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = [
    "interrupted",
    "interrupts_deferred",
    "note_interrupt",
    "unwatch_ctrl_c",
    "watch_ctrl_c",
]

_interrupted = False  # the user pressed Ctrl-C while a loader ran (see the docstring)
_watching = 0  # thread pools open that asked for Ctrl-C to be noted where it lands
_holding = 0  # interrupts_deferred blocks running (they put the handler back themselves)

Handler = Callable[[int, FrameType | None], Any]


def note_interrupt() -> None:
    """A ``KeyboardInterrupt`` is passing through a loader's iteration (caught later or
    not, it means the user wants out)."""
    global _interrupted
    _interrupted = True


def interrupted() -> bool:
    """Whether the user pressed Ctrl-C while a loader of this process ran."""
    return _interrupted


class _Noting:
    """The program's SIGINT handler, wrapped: notes the Ctrl-C, then hands it on."""

    def __init__(self, wrapped: Handler) -> None:
        self.wrapped = wrapped

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        note_interrupt()
        return self.wrapped(signum, frame)


def _wanted(handler: Any) -> Any:
    """SIGINT's handler as the pools watching want it: the program's ``handler``,
    wrapped while any watches (a callable one only: SIG_IGN and SIG_DFL stay as set)."""
    if _watching and callable(handler) and not isinstance(handler, _Noting):
        return _Noting(handler)
    if not _watching and isinstance(handler, _Noting):
        return handler.wrapped
    return handler


def _settle() -> None:
    """Install the wanted handler now; from the main thread, outside a deferral (whose
    end installs it)."""
    if _holding or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if current is None:  # installed from C: not ours to swap
        return
    wanted = _wanted(current)
    if wanted is not current:
        signal.signal(signal.SIGINT, wanted)


def watch_ctrl_c() -> None:
    """A thread pool opens: note a Ctrl-C wherever it lands until it closes."""
    global _watching
    _watching += 1
    _settle()


def unwatch_ctrl_c() -> None:
    """A thread pool closes (the wrapper stays until the main thread next settles it, if
    this is not the main thread: harmless, it only notes)."""
    global _watching
    _watching = max(0, _watching - 1)
    _settle()


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
    global _holding
    previous = signal.signal(signal.SIGINT, hold)
    _holding += 1
    try:
        yield
    finally:
        _holding -= 1
        previous = _wanted(previous)  # (a pool opened or closed in the block)
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[-1])
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)
