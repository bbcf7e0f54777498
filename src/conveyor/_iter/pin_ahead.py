"""Pin the next batch in a thread while the user trains on the current one.

``pin_memory=True`` copies every batch into page-locked memory, which takes as long
as a memcpy of the batch: for image batches, a good part of a training step. torch
hides it behind a thread that pins each batch as it arrives. conveyor's loop hands
out batches in the main thread, so it pins one batch ahead instead: when a batch is
handed out and the next one has already arrived, that one is decoded in the main
thread and pinned in this stage's thread, while the user works on the batch just
handed out. One batch at most is pinned ahead, so the stage adds one batch of
page-locked memory to the one the user holds.

Slots are freed by weak-reference callbacks that run in whichever thread drops a
batch's last reference. The stage keeps the unpinned batch itself and drops it in
the main thread once the pin has finished, so no slot is ever released from the
pinning thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

THREAD_NAME = "conveyor-pin"


@dataclass(slots=True)
class _Ahead:
    key: object  # whose batch it is (the task book's entry)
    source: list[Any]  # the unpinned batch, in a box the main thread empties
    pinned: Future[Any]


def _pin_boxed(pin: Callable[[Any], Any], box: list[Any]) -> Any:
    return pin(box[0])


def _failed(error: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(error)
    return future


class PinAhead:
    """One batch pinned ahead (see the module docstring); the thread starts lazily."""

    def __init__(
        self, pin: Callable[[Any], Any], initializer: Callable[[], None] | None = None
    ) -> None:
        self._pin = pin
        self._initializer = initializer
        self._executor: ThreadPoolExecutor | None = None
        self._ahead: _Ahead | None = None

    @property
    def idle(self) -> bool:
        """Whether no batch is pinned ahead now (another may start)."""
        return self._ahead is None

    def start(self, key: object, batch: Any) -> None:
        """Pin ``batch`` in the thread; :meth:`take` with the same key collects it."""
        assert self._ahead is None, "one batch is pinned ahead at a time"
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=THREAD_NAME, initializer=self._initializer
            )
        box = [batch]
        self._ahead = _Ahead(key, box, self._executor.submit(_pin_boxed, self._pin, box))

    def fail(self, key: object, error: BaseException) -> None:
        """The batch could not even be decoded: :meth:`take` raises ``error`` for it."""
        assert self._ahead is None, "one batch is pinned ahead at a time"
        self._ahead = _Ahead(key, [], _failed(error))

    def take(self, key: object) -> tuple[bool, Any]:
        """``(True, pinned batch)`` if ``key``'s batch was pinned ahead, waiting for the
        pin to finish (and raising what it raised); ``(False, None)`` otherwise."""
        ahead = self._ahead
        if ahead is None or ahead.key is not key:
            return False, None
        self._ahead = None
        try:
            return True, ahead.pinned.result()
        finally:
            ahead.source.clear()  # the unpinned batch dies here, in the main thread

    def drop(self) -> object | None:
        """Forget the batch pinned ahead (an abandoned epoch, a closed iterator) once its
        pin has finished; the key it was pinned for, or None."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        wait([ahead.pinned])
        ahead.source.clear()
        return ahead.key

    def close(self) -> None:
        """Drop what is ahead and stop the thread (joined: nothing outlives the loop)."""
        self.drop()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
