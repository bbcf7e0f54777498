"""Order events between the test and its workers without sleeping.

A :class:`Mailbox` is a named pipe in ``tmp_path``. Code in any process (a dataset in a
worker, under any start method: only the path travels) calls :func:`post` to say that
something happened; the test blocks in :meth:`Mailbox.wait` until it has, and code in
another worker can block in :func:`wait_posted`. :func:`wait_exit` blocks until a
process has exited (a pidfd: no polling, and nothing is reaped behind
multiprocessing's back)::

    with Mailbox(tmp_path / "reached") as box:
        loader = DataLoader(Dataset(box.path), num_workers=1)   # dataset[3] posts its pid
        it = iter(loader)
        pid = int(box.wait())          # the worker is in dataset[3] now

Every wait has a timeout and fails loudly when it passes.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path
from types import TracebackType

__all__ = ["Mailbox", "post", "wait_exit", "wait_posted"]

DEFAULT_TIMEOUT_S = 30.0


def post(path: str, text: str) -> None:
    """Append the line ``text`` to the mailbox at ``path`` (from any process).

    Fails (ENXIO) rather than blocking when the mailbox is closed already.
    """
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, text.encode() + b"\n")  # one small write: atomic on a pipe
    finally:
        os.close(fd)


def _read_line(fd: int, path: str, buffer: bytes, timeout: float) -> tuple[str, bytes]:
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0.0))
        if not ready:
            raise TimeoutError(f"nothing was posted to {path} within {timeout:.0f} s")
        buffer += os.read(fd, 4096)
    line, _, rest = buffer.partition(b"\n")
    return line.decode(), rest


def wait_posted(path: str, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """Block, in any process, until a line is posted to the open mailbox at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        line, _ = _read_line(fd, path, b"", timeout)  # posts are single lines: nothing left
    finally:
        os.close(fd)
    return line


class Mailbox:
    """A named pipe at ``path``, open for as long as the test holds it."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = str(path)
        self._read = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        # A writer of our own: no end of file between posts, and a post never finds the
        # pipe without a reader.
        self._keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._buffer = b""

    def wait(self, timeout: float = DEFAULT_TIMEOUT_S) -> str:
        """The next line posted (blocks until there is one)."""
        line, self._buffer = _read_line(self._read, self.path, self._buffer, timeout)
        return line

    def close(self) -> None:
        os.close(self._keep)
        os.close(self._read)

    def __enter__(self) -> Mailbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def wait_exit(pid: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Block until process ``pid`` has exited (a zombie has), or fail after ``timeout``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # exited and reaped already
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        raise TimeoutError(f"process {pid} was still running after {timeout:.0f} s")
