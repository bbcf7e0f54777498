"""What a fork waits for: every :class:`ForkGate` free, so that no thread of conveyor's
is copied into the child mid-work (it could hold a lock there that nothing would ever
release). The pin thread holds one while it pins; every worker start takes them all."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import ClassVar

__all__ = ["ForkGate", "gates_held"]


class ForkGate:
    """Held by one of conveyor's threads while it works (the pin thread, while it
    pins). A fork waits until every gate is free: a thread copied into the child
    mid-work could hold a lock there that nothing will ever release."""

    _all: ClassVar[weakref.WeakSet[ForkGate]] = weakref.WeakSet()

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a thread forking under its own gate must not wait
        ForkGate._all.add(self)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@contextmanager
def gates_held() -> Iterator[None]:
    with ExitStack() as held:
        for gate in list(ForkGate._all):
            held.enter_context(gate)
        yield


def _after_fork_in_child() -> None:
    """A forked child has none of this process's other threads: no gate is held there."""
    ForkGate._all = weakref.WeakSet()


os.register_at_fork(after_in_child=_after_fork_in_child)
