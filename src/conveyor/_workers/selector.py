"""What the process pool waits on: its workers' result pipes and process sentinels, and
the task pipes that have bytes queued, watched for room (the main process never blocks on
a write: see outbox.py).

One epoll for the pool's life, asked directly: the ``selectors`` module's bookkeeping
costs more Python calls than the wait itself at thousands of batches a second.
Descriptors are watched by number: the pool stops watching a worker's before it closes
them (a number reused by a replacement's pipe must not find the old worker).
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PoolSelector"]

_ANY = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP


class PoolSelector:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watched: dict[int, tuple[str, Any]] = {}  # fd -> (what it is, whose)
        self._writers: dict[int, Any] = {}  # task pipes watched for room: fd -> whose

    def watch(self, fd: int, role: str, owner: Any) -> None:
        """Wake for ``fd`` when it can be read (or its peer is gone)."""
        self._epoll.register(fd, _ANY)
        self._watched[fd] = (role, owner)

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (read or write); nothing if it was not."""
        if self._watched.pop(fd, None) is not None or self._writers.pop(fd, None) is not None:
            with contextlib.suppress(OSError, ValueError):  # closed already: epoll forgot it
                self._epoll.unregister(fd)

    def want_room(self, fd: int, owner: Any) -> None:
        """``fd`` has bytes queued: wake when it has room for them too."""
        if fd not in self._writers:
            self._writers[fd] = owner
            self._epoll.register(fd, select.EPOLLOUT)

    def select(self, timeout: float | None, flush: Callable[[Any], bool]) -> list[tuple[str, Any]]:
        """What can be read, as ``(role, owner)``; [] once ``timeout`` passes. A pipe that
        has room meanwhile is given to ``flush`` (True: nothing is queued any more) and
        the wait goes on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        remaining = -1.0 if timeout is None else max(0.0, timeout)
        watched, writers = self._watched, self._writers
        while True:
            ready = []
            for fd, _ in self._epoll.poll(remaining):
                found = watched.get(fd)
                if found is not None:
                    ready.append(found)
                elif (owner := writers.get(fd)) is not None and flush(owner):
                    del writers[fd]
                    with contextlib.suppress(OSError, ValueError):
                        self._epoll.unregister(fd)
            if ready:
                return ready
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []

    def close(self) -> None:
        self._watched.clear()
        self._writers.clear()
        self._epoll.close()
