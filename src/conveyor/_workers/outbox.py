"""Tasks to one worker, written without ever blocking the main process.

A worker may be blocked writing a large batch into its result pipe; if the
main process blocked writing a task into that worker's full task pipe at the
same time, both would wait forever. So the main process's end of each task
pipe is non-blocking: what does not fit now waits here, and the pool writes
it when the pipe has room, while it keeps reading results.

Frames are multiprocessing's (a 4-byte big-endian length, or -1 and an
8-byte length beyond 2 GiB, then the pickle), so the worker reads them with
``Connection.recv()`` as usual.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from multiprocessing.reduction import ForkingPickler
from typing import Any


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
        data = memoryview(ForkingPickler.dumps(message))
        n = data.nbytes
        header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
        if self._queue:
            self._queue += (memoryview(header), data)
            self.flush()
            return
        try:
            written = os.writev(self.fd, (header, data))  # one system call, no copy
        except BlockingIOError:
            written = 0
        if written < len(header):
            self._queue += (memoryview(header)[written:], data)
        elif written < len(header) + n:
            self._queue.append(data[written - len(header) :])

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
