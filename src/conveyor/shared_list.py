"""A list that forked workers can read without copying it.

A dataset holding a plain list of a million paths looks free to share with
forked workers: the pages are copy-on-write. But reading ``paths[i]`` in a
worker increments the string's reference count, a write, so the kernel copies
the page holding it; over an epoch every worker copies nearly the whole list.
Memory grows by the list's size per worker, looking like a leak (torch issue
#13246). :class:`SharedList` keeps the items in one ``bytes`` buffer (UTF-8
text when every item is a ``str``, otherwise one pickle per item) plus an
offsets array: reading item ``i`` decodes a new object from pages that are
only read, so nothing is copied.
"""

from __future__ import annotations

import pickle
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, pairwise
from typing import Any, Generic, TypeVar, overload

__all__ = ["SharedList"]

T = TypeVar("T")
_REPR_ITEMS = 5


class SharedList(Sequence[T], Generic[T]):
    """An immutable list stored as one buffer, for datasets read by forked workers.

    ``SharedList(paths)`` takes any iterable of picklable objects — paths,
    small dicts of metadata, tuples — and supports ``len``, indexing
    (negative too), slicing (a ``SharedList``), iteration, ``in`` and ``==``
    with lists. Each read builds a new object, so mutating it changes nothing
    stored. A list of only ``str`` is stored as UTF-8 text; anything else as
    one pickle per item. It pickles as its two buffers, so ``spawn`` workers
    get a compact copy. It works with torch's ``DataLoader`` too::

        class Files(Dataset):
            def __init__(self, root):
                self.paths = conveyor.SharedList(sorted(glob.glob(f"{root}/**/*.jpg")))
    """

    # Item i is _buffer[_offsets[i] : _offsets[i + 1]]: UTF-8 text when _text,
    # else a pickle.
    __slots__ = ("_buffer", "_offsets", "_text")

    def __init__(self, items: Iterable[T] = ()) -> None:
        if isinstance(items, SharedList):  # immutable: share its buffers
            self._text: bool = items._text
            self._buffer: bytes = items._buffer
            self._offsets: array[int] = items._offsets
            return
        values: list[Any] = list(items)
        encoded = _encode_text(values) if all(type(v) is str for v in values) else None
        self._text = encoded is not None
        if encoded is not None:
            self._buffer, lengths = encoded
        else:
            pickles = [_pickle_item(i, v) for i, v in enumerate(values)]
            self._buffer = b"".join(pickles)
            lengths = map(len, pickles)
        self._offsets = _offsets(lengths, len(self._buffer))

    @classmethod
    def _from_parts(cls, text: bool, buffer: bytes, offsets: array[int]) -> SharedList[Any]:
        new: SharedList[Any] = cls.__new__(cls)
        new._text = text
        new._buffer = buffer
        new._offsets = offsets
        return new

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> SharedList[T]: ...

    def __getitem__(self, index: int | slice) -> T | SharedList[T]:
        offsets = self._offsets
        if type(index) is int and index >= 0:  # the dataset's hot path
            try:
                stop = offsets[index + 1]
            except IndexError:
                raise IndexError(
                    f"SharedList index {index} out of range for length {len(self)}"
                ) from None
            start = offsets[index]
        elif isinstance(index, slice):
            return self._slice(index)
        else:
            i = _as_index(index)
            n = len(offsets) - 1
            if not -n <= i < n:
                raise IndexError(f"SharedList index {i} out of range for length {n}")
            start, stop = offsets[i % n], offsets[i % n + 1]
        raw = self._buffer[start:stop]
        item: Any = raw.decode() if self._text else pickle.loads(raw)
        return item

    def _slice(self, index: slice) -> SharedList[T]:
        chosen = range(len(self))[index]
        offsets = self._offsets
        if chosen.step == 1 and chosen:
            start, stop = offsets[chosen.start], offsets[chosen.stop]
            part = array(
                offsets.typecode, (o - start for o in offsets[chosen.start : chosen.stop + 1])
            )
            return self._from_parts(self._text, self._buffer[start:stop], part)
        pieces = [self._buffer[offsets[i] : offsets[i + 1]] for i in chosen]
        buffer = b"".join(pieces)
        return self._from_parts(self._text, buffer, _offsets(map(len, pieces), len(buffer)))

    def __iter__(self) -> Iterator[T]:
        buffer = self._buffer
        if self._text:
            for start, stop in pairwise(self._offsets):
                yield buffer[start:stop].decode()  # type: ignore[misc]
        else:
            for start, stop in pairwise(self._offsets):
                yield pickle.loads(buffer[start:stop])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (SharedList, list)):
            return NotImplemented
        if len(self) != len(other):
            return False
        if isinstance(other, SharedList) and self._text and other._text:
            # UTF-8 is canonical: equal texts are equal bytes.
            return self._offsets == other._offsets and self._buffer == other._buffer
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # compares equal to lists, like a list

    def __repr__(self) -> str:
        n = len(self)
        shown = ", ".join(repr(self[i]) for i in range(min(n, _REPR_ITEMS)))
        if n <= _REPR_ITEMS:
            return f"SharedList([{shown}])"
        return f"SharedList([{shown}, ...], len={n:_})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._text, self._buffer, self._offsets))

    @property
    def nbytes(self) -> int:
        """Bytes held: the buffer and the offsets."""
        return len(self._buffer) + self._offsets.itemsize * len(self._offsets)


def _rebuild(text: bool, buffer: bytes, offsets: array[int]) -> SharedList[Any]:
    return SharedList._from_parts(text, buffer, offsets)


def _offsets(lengths: Iterable[int], total: int) -> array[int]:
    """Where each item starts, and the end: 4 bytes each while the buffer allows."""
    offsets = array("I" if total < 2**32 else "q", [0])
    offsets.extend(accumulate(lengths))
    return offsets


def _encode_text(values: list[str]) -> tuple[bytes, Iterable[int]] | None:
    """UTF-8 bytes and each item's length; None if some item is not valid UTF-8."""
    joined = "".join(values)
    if joined.isascii():  # the common case (paths): one character, one byte
        return joined.encode("ascii"), map(len, values)
    try:
        lengths = [len(v) if v.isascii() else len(v.encode()) for v in values]
    except UnicodeEncodeError:  # lone surrogates (undecodable file names): pickle them
        return None
    return joined.encode(), lengths


def _pickle_item(index: int, value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"SharedList stores each item pickled, and item {index} "
            f"({type(value).__name__}) cannot be pickled: {exc}"
        ) from exc


def _as_index(index: Any) -> int:
    try:
        return int(index.__index__())
    except AttributeError:
        raise TypeError(
            f"SharedList indices must be integers or slices, not {type(index).__name__}"
        ) from None
