"""What the process pool waits on: its workers' result pipes and process sentinels, and
the task pipes that have bytes queued, watched for room (the main process never blocks on
a write: see outbox.py).

One epoll for the pool's life, asked directly: the ``selectors`` module's bookkeeping
costs more Python calls than the wait itself at thousands of batches a second.
Descriptors are watched by number: the pool stops watching a worker's before it closes
them (a number reused by a replacement's pipe must not find the old worker).

While the loop waits for one worker's reply (the next batch in order), the other
result pipes that may wait (``deferred``) are not watched for data, only for their end
(epoll reports a hang-up whatever it is asked): a reply the loop does not need yet stays
in its pipe, read when the loop turns to it, instead of waking the main process for
nothing. With two workers, a third of the main process's wake-ups were such, each a
sleep and a wake-up more than the batch needed (about 70 us of its CPU on this
project's 2-core VMs). A wait that runs out its timeout reads every pipe before it says
nothing came: the deadlines judge what the workers sent, not what the loop left unread.
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
        self._deferred: set[int] = set()  # result pipes that may wait while another is awaited
        self._muted: set[int] = set()  # of those, the ones not watched for data now

    def watch(self, fd: int, role: str, owner: Any, *, deferred: bool = False) -> None:
        """Wake for ``fd`` when it can be read (or its peer is gone). ``deferred``: a
        result pipe whose data may wait while the loop awaits another (see select)."""
        self._epoll.register(fd, _ANY)
        self._watched[fd] = (role, owner)
        if deferred:
            self._deferred.add(fd)

    def watching(self, fd: int) -> bool:
        """Whether ``fd`` is watched for reading."""
        return fd in self._watched

    def never_defer(self, fd: int) -> None:
        """Watch ``fd`` for data in every wait from now on (its peer sends frames too large
        for a pipe: left unread, one would stop its writer until the loop turned to it)."""
        self._deferred.discard(fd)
        if fd in self._muted:
            self._muted.discard(fd)
            self._epoll.modify(fd, _ANY)

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (read or write); nothing if it was not."""
        self._deferred.discard(fd)
        self._muted.discard(fd)
        if self._watched.pop(fd, None) is not None or self._writers.pop(fd, None) is not None:
            with contextlib.suppress(OSError, ValueError):  # closed already: epoll forgot it
                self._epoll.unregister(fd)

    def want_room(self, fd: int, owner: Any) -> None:
        """``fd`` has bytes queued: wake when it has room for them too."""
        if fd not in self._writers:
            self._writers[fd] = owner
            self._epoll.register(fd, select.EPOLLOUT)

    def select(
        self, timeout: float | None, flush: Callable[[Any], bool], awaited: int | None = None
    ) -> list[tuple[str, Any]]:
        """What can be read, as ``(role, owner)``; [] once ``timeout`` passes. A pipe that
        has room meanwhile is given to ``flush`` (True: nothing is queued any more) and
        the wait goes on. ``awaited``: the result pipe the loop waits for; the deferred
        others wake it only by their end, or once ``timeout`` passes."""
        self._attend(awaited)
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
                    if not self._muted:
                        return []
                    self._attend(None)  # one more look, at every pipe, without waiting
                    remaining = 0.0

    def _attend(self, awaited: int | None) -> None:
        """Watch ``awaited`` and every pipe that may not wait for data; stop watching
        the other deferred ones for it (each change, one ``epoll_ctl``: two a wait with
        two workers, a small part of a wake-up saved). None: watch them all."""
        muted, epoll = self._muted, self._epoll
        if awaited is None:
            for fd in muted:
                epoll.modify(fd, _ANY)
            muted.clear()
            return
        deferred = self._deferred
        if awaited in muted:
            muted.discard(awaited)
            epoll.modify(awaited, _ANY)
        if len(muted) < len(deferred) - (awaited in deferred):
            for fd in deferred:
                if fd != awaited and fd not in muted:
                    epoll.modify(fd, 0)  # (a hang-up is still reported)
                    muted.add(fd)

    def close(self) -> None:
        self._watched.clear()
        self._writers.clear()
        self._deferred.clear()
        self._muted.clear()
        self._epoll.close()
