"""A worker's incoming messages, in order, with the slot releases they carry read early.

The main process says which slots it no longer uses on the next task it sends that
worker. With several tasks queued (run-ahead), that task may wait in the pipe behind
many others while the worker, believing its slots held, runs out of them. So when the
worker finds no free slot, it reads what has arrived and applies the releases of the
tasks it has not run yet (each once: the task keeps no copy), before giving up on
shared memory for a batch.
"""

from __future__ import annotations

import dataclasses
import select
from collections import deque
from typing import Any

from .._protocol import Release, Task
from .._transport.arena import WorkerArena
from .wire import FrameReader


class Inbox:
    def __init__(self, fd: int, arena: WorkerArena) -> None:
        self._fd = fd
        self._reader = FrameReader(fd)
        self._ahead: deque[Any] = deque()  # read early, not yet handed to the loop
        self._arena = arena

    def recv(self) -> Any:
        """The next message; blocks. EOFError once the main process is gone."""
        if self._ahead:
            return self._ahead.popleft()
        return self._reader.recv()

    def reclaim(self) -> bool:
        """Apply the releases of every task already sent; True if there were any."""
        readable, _, _ = select.select([self._fd], [], [], 0)
        messages = self._reader.read() if readable else self._reader.buffered()
        freed = False
        for message in messages:
            if isinstance(message, (Task, Release)) and message.released:
                self._arena.release(message.released)
                freed = True
                if isinstance(message, Release):
                    continue
                message = dataclasses.replace(message, released=())
            self._ahead.append(message)
        return freed
