"""Tasks to one worker, written without ever blocking the main process.

A worker may be blocked writing a large batch into its result pipe; if the
main process blocked writing a task into that worker's full task pipe at the
same time, both would wait forever. So the main process's end of each task
pipe is non-blocking: what does not fit now waits here, and the pool writes
it when the pipe has room, while it keeps reading results.

Frames are those of :mod:`conveyor._workers.wire`, which the worker reads.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

from . import wire


class Outbox:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._queue: deque[memoryview] = deque()

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def send(self, message: Any) -> None:
        """Queue a message and write what the pipe takes now.

        Raises BrokenPipeError when the worker is gone (the caller decides).
        """
        self.write(wire.encode(message))

    def write(self, frame: bytes) -> bool:
        """Queue a frame (see wire.py) and write what the pipe takes now; True if it all
        went (False: bytes wait here for room)."""
        if self._queue:
            # Written as soon as the pipe has room (a worker short of slots reads ahead
            # for the slots a frame frees: they must not wait here).
            self._queue.append(memoryview(frame))
            return self.flush()
        try:
            written = os.write(self.fd, frame)
        except BlockingIOError:
            written = 0
        if written < len(frame):
            self._queue.append(memoryview(frame)[written:])
            return False
        return True

    def flush(self) -> bool:
        """Write queued bytes until the pipe is full; True when nothing is left."""
        queue = self._queue
        while queue:
            chunk = queue[0]
            try:
                written = os.write(self.fd, chunk)
            except BlockingIOError:
                return False
            if written < len(chunk):
                queue[0] = chunk[written:]
                return False
            queue.popleft()
        return True

    def clear(self) -> None:
        self._queue.clear()
