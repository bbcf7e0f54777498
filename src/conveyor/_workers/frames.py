"""Reading frames (see wire.py) off a pipe, buffered: one ``read`` takes every frame the
pipe holds, so a worker that has several tasks queued, or a main process with several
batches waiting, pays one system call for all of them."""

from __future__ import annotations

import os
from typing import Any

from .wire import _BYTE_BATCH, _LENGTH, BodyDecoder, Released

__all__ = ["READ_SIZE", "FrameReader"]

READ_SIZE = 1 << 16


class FrameReader:
    """Frames from one pipe, read in large chunks.

    :meth:`recv` blocks for one message (the worker's side); :meth:`read` takes what one
    ``read`` brings and returns the messages completed so far (the main process's side,
    on a non-blocking descriptor the selector said is readable). A frame larger than a
    read is gathered into a buffer of its own size, so a huge batch costs no re-copying.
    """

    def __init__(self, fd: int, on_released: Released | None = None) -> None:
        """``on_released``: given the freed slots each frame carries, as it is read."""
        self.fd = fd
        self._data = b""  # read, not yet parsed from _at on (immutable: views stay valid)
        self._at = 0
        self._large: bytearray | None = None  # the body of a large frame being read
        self._large_filled = 0
        self._decoder = BodyDecoder(on_released)
        self._batch = self._decoder.decode_batch  # a batch's frame: no dispatch on its kind
        self.eof = False

    def recv(self) -> Any:
        """The next message; blocks until it is whole. EOFError once the peer is gone."""
        while (message := self.take()) is None:
            self._fill()
        return message

    def take(self) -> Any:
        """The next whole message already read (frames of freed slots alone passed over:
        their slots went to ``on_released``); None if none is."""
        while (message := self._next()) is None:
            pass
        return None if message is _INCOMPLETE else message

    def fill(self) -> None:
        """One read (blocks until the peer writes); EOFError once the peer is gone."""
        self._fill()

    def read(self) -> list[Any]:
        """The messages one read completes (none if it brought only part of one)."""
        try:
            self._fill()
        except BlockingIOError:
            pass
        except EOFError:
            self.eof = True
        return self.buffered()

    def buffered(self) -> list[Any]:
        """The whole messages already read, without reading."""
        messages = []
        while (message := self._next()) is not _INCOMPLETE:
            if message is not None:
                messages.append(message)
        return messages

    def drain(self) -> list[Any]:
        """Every message left in a pipe whose writer is gone (or has nothing more now)."""
        messages = self.buffered()
        while not self.eof:
            try:
                self._fill()
            except BlockingIOError:
                break
            except EOFError:
                self.eof = True
            except OSError:  # closed under us
                break
            messages += self.buffered()
        return messages

    def _fill(self) -> None:
        if self._large is not None:
            with memoryview(self._large) as view:
                count = os.readv(self.fd, [view[self._large_filled :]])
            if not count:
                raise EOFError("the other end of the pipe is closed")
            self._large_filled += count
            return
        chunk = os.read(self.fd, READ_SIZE)
        if not chunk:
            raise EOFError("the other end of the pipe is closed")
        self._data = self._data[self._at :] + chunk if self._at < len(self._data) else chunk
        self._at = 0

    def _next(self) -> Any:
        """The message of the next whole frame read: None for a frame of freed slots alone
        (its slots went to ``on_released``), ``_INCOMPLETE`` if no whole frame is here."""
        large = self._large
        if large is not None:
            if self._large_filled < len(large):
                return _INCOMPLETE
            self._large = None
            return self._decoder.decode(memoryview(large))
        data, at = self._data, self._at
        if len(data) - at < _LENGTH.size:
            return _INCOMPLETE
        (length,) = _LENGTH.unpack_from(data, at)
        start = at + _LENGTH.size
        end = start + length
        if end > len(data):
            if length > READ_SIZE:  # gather the rest in place
                self._large = bytearray(length)
                self._large_filled = len(data) - start
                self._large[: self._large_filled] = memoryview(data)[start:]
                self._data, self._at = b"", 0
            return _INCOMPLETE
        self._at = end
        if data[start] == _BYTE_BATCH:
            return self._batch(memoryview(data)[start:end])
        return self._decoder.decode(memoryview(data)[start:end])


_INCOMPLETE: Any = object()  # FrameReader._next: no whole frame has been read
