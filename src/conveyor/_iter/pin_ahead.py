"""Pin the next batch in a thread while the user trains on the current one.

``pin_memory=True`` copies every batch into page-locked memory: a copy of the whole
batch on the training loop's path unless something else makes it. torch hides it
behind a thread that pins each batch as it arrives. conveyor's loop hands out
batches in the main thread, so it pins one batch ahead instead: when a batch is
handed out and the next one has already arrived, that one is decoded in the main
thread and pinned in this stage's thread, while the user works on the batch just
handed out. One batch at most is pinned ahead, so the stage adds one batch of
page-locked memory to the one the user holds.

Slots are freed by weak-reference callbacks that run in whichever thread drops a
batch's last reference. Both the unpinned and the pinned batch (which may share
arrays with it: pinning leaves what is not a tensor as it is) pass between the
threads in a box that only the main thread empties, so no slot is ever released
from the pinning thread.

The thread pins under a :class:`~conveyor._workers.fork_gate.ForkGate`: a fork of this
process (a replacement worker, another loader's workers) waits for the pin in
flight, so the thread is never copied into a child holding a lock. It lives while
an epoch runs: stopped when the iterator closes or the epoch ends, started again
with the next batch pinned ahead.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._workers.fork_gate import ForkGate

THREAD_NAME = "conveyor-pin"


@dataclass(slots=True)
class _Raised:
    error: BaseException


@dataclass(slots=True)
class _Ahead:
    """A batch sent to the thread. ``box`` holds the unpinned batch; the thread appends
    the pinned one (or what it raised) and sets ``done``; the main thread empties the
    box. The batches pass only through the box, never through the thread's variables,
    so neither can lose its last reference in the thread."""

    key: object  # whose batch it is (the task book's entry)
    box: list[Any]
    done: threading.Event = field(default_factory=threading.Event)


def _serve(
    pin: Callable[[Any], Any],
    setup: Callable[[], None] | None,
    inbox: queue.SimpleQueue[Any],
    gate: ForkGate,
) -> None:
    """The thread: pin each batch sent until ``None`` comes; it works only under ``gate``."""
    setup_error: _Raised | None = None
    try:
        if setup is not None:
            with gate:
                setup()
    except BaseException as error:  # every batch will say why it could not be pinned
        setup_error = _Raised(error)
    while (ahead := inbox.get()) is not None:
        if setup_error is not None:
            ahead.box.append(setup_error)
            ahead.done.set()
        else:
            with gate:
                _pin_into(ahead, pin, BaseException)  # nothing above this thread to catch it


def _pin_into(ahead: _Ahead, pin: Callable[[Any], Any], catch: type[BaseException]) -> None:
    try:
        ahead.box.append(pin(ahead.box[0]))
    except catch as error:
        ahead.box.append(_Raised(error))
    ahead.done.set()


ThreadSetup = Callable[[], Callable[[], None] | None]


class PinAhead:
    """One batch pinned ahead (see the module docstring); the thread starts lazily.

    ``setup`` is called in the main thread when the thread starts, that is once a first
    batch has been handed out (the workers are running: it may initialise the
    accelerator, which must not happen before they fork); what it returns runs first in
    the thread.
    """

    def __init__(self, pin: Callable[[Any], Any], setup: ThreadSetup | None = None) -> None:
        self._pin = pin
        self._setup = setup
        self._owner = os.getpid()
        self._inbox: queue.SimpleQueue[_Ahead | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ahead: _Ahead | None = None
        self._gate = ForkGate()

    @property
    def idle(self) -> bool:
        """Whether no batch is pinned ahead now (another may start)."""
        return self._ahead is None

    def pin_next(self, key: object, decode: Callable[[], Any]) -> None:
        """Decode ``key``'s batch and pin it in the thread, unless a batch is ahead
        already; what decoding raises, :meth:`take` raises for it."""
        if self._ahead is not None:
            return
        try:
            batch = decode()
        except Exception as error:
            self.fail(key, error)  # raised when its turn comes
        else:
            self.start(key, batch)

    def start(self, key: object, batch: Any) -> None:
        """Pin ``batch`` in the thread; :meth:`take` with the same key collects it."""
        assert self._ahead is None, "one batch is pinned ahead at a time"
        ahead = self._ahead = _Ahead(key, [batch])
        if self._thread is None:
            try:
                self._thread = self._start_thread()
            except Exception:  # no thread to be had (a limit on threads): pin it here
                _pin_into(ahead, self._pin, Exception)
                return
        self._inbox.put(ahead)

    def _start_thread(self) -> threading.Thread:
        setup = self._setup() if self._setup is not None else None
        thread = threading.Thread(
            target=_serve,
            args=(self._pin, setup, self._inbox, self._gate),
            name=THREAD_NAME,
            daemon=True,  # close() joins it; a leaked iterator must not block exit
        )
        thread.start()
        return thread

    def fail(self, key: object, error: BaseException) -> None:
        """The batch could not even be decoded: :meth:`take` raises ``error`` for it."""
        assert self._ahead is None, "one batch is pinned ahead at a time"
        self._ahead = _Ahead(key, [None, _Raised(error)])
        self._ahead.done.set()

    def take(self, key: object) -> tuple[bool, Any]:
        """``(True, pinned batch)`` if ``key``'s batch was pinned ahead, waiting for the
        pin to finish (and raising what it raised); ``(False, None)`` otherwise."""
        ahead = self._ahead
        if ahead is None or ahead.key is not key:
            return False, None
        self._ahead = None
        ahead.done.wait()
        outcome = ahead.box.pop()
        ahead.box.clear()  # the unpinned batch dies here, in the main thread
        if isinstance(outcome, _Raised):
            raise outcome.error
        return True, outcome

    def drop(self) -> object | None:
        """Forget the batch pinned ahead (an abandoned epoch, a closed iterator) once its
        pin has finished; the key it was pinned for, or None."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if self._can_wait():
            ahead.done.wait()
            ahead.box.clear()
        return ahead.key

    def close(self) -> None:
        """Drop what is ahead and stop the thread (joined: nothing outlives the epoch);
        the next :meth:`start` starts another."""
        self.drop()
        thread, self._thread = self._thread, None
        if thread is None or os.getpid() != self._owner:
            return  # a forked child has no thread to stop
        self._inbox.put(None)
        if thread is not threading.current_thread():
            thread.join()

    def _can_wait(self) -> bool:
        """Whether the thread can finish what it does while this one waits: not when
        this is the thread itself (the garbage collector ran the iterator's finalizer
        during a pin), nor in a forked child, which has no such thread."""
        return os.getpid() == self._owner and threading.current_thread() is not self._thread
