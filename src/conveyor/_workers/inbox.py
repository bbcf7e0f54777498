"""A worker process's incoming messages, in order; the slots its frames free go to its
arena as each frame is read.

The main process says which slots it no longer uses in the next frame it sends that
worker (a task's, or one of its own: see wire.py). With several tasks queued
(run-ahead), that frame may wait in the pipe behind many others while the worker,
believing its slots held, runs out of them. So when the worker finds no free slot, it
reads what has arrived (:meth:`Inbox.reclaim`): reading a frame frees its slots, and
the messages wait here for their turn.
"""

from __future__ import annotations

import select
from collections import deque
from typing import Any

from .._transport.arena import WorkerArena
from .frames import FrameReader

# Seconds a worker waits for its next task before its free slots' pages go back: far
# longer than a loop that keeps it busy leaves it waiting, far shorter than a training
# step that keeps it idle.
IDLE_S = 0.05


class Inbox:
    def __init__(self, fd: int, arena: WorkerArena) -> None:
        self._fd = fd
        self._arena = arena
        self._reader = FrameReader(fd, on_released=self._released)
        self._ahead: deque[Any] = deque()  # read early, not yet handed to the core
        self._freed = 0  # slot ids freed so far

    def recv(self) -> Any:
        """The next message; blocks. EOFError once the main process is gone.

        A worker that waits for its next task more than IDLE_S with free slots holding
        pages gives those pages back (see WorkerArena.drop_idle_pages); so it does again
        when slots freed while it waits (a frame of their own) keep theirs that long."""
        if self._ahead:
            return self._ahead.popleft()
        reader, arena = self._reader, self._arena
        while (message := reader.take()) is None:
            if arena.idle_bytes() and not select.select([self._fd], [], [], IDLE_S)[0]:
                arena.drop_idle_pages()
                continue  # (nothing idle now: the next pass blocks in the read)
            reader.fill()
        return message

    def reclaim(self) -> bool:
        """Read every frame already sent (those read and not parsed first: no system
        call if they free a slot); True if they freed any slot."""
        freed = self._freed
        self._ahead.extend(self._reader.buffered())
        if self._freed == freed and select.select([self._fd], [], [], 0)[0]:
            self._ahead.extend(self._reader.read())
        return self._freed > freed

    def _released(self, slot_ids: tuple[int, ...], alone: bool) -> None:
        self._arena.release(slot_ids)
        self._freed += len(slot_ids)
        if alone:  # (many at once: an epoch's end or a discarded one) retire the outsized
            self._arena.trim()
