"""Frames on the pipes between the main process and a worker.

Every message travels as one frame: an 8-byte little-endian length, then a body whose
first byte says how the rest is encoded. The two messages sent once per batch have a
fixed binary layout (``struct``), which costs a fraction of pickling a dataclass:

- ``T``: a :class:`Task` whose other fields (excluded indices) have their defaults;
  its ``index`` (whatever the sampler yielded) is pickled, so its types come back
  exactly, or, when it is a run of consecutive ints (``Task.consecutive``), sent as its
  first value and length. Any task frame (``T``, or ``P`` for a task) also carries the
  slots the main process freed since its last frame to that worker.
- ``R``: only freed slots, when no task is going to that worker to carry them.
- ``B``: a :class:`BatchDone` whose payload is a :class:`SlotPayload` and whose other
  fields (skipped samples, states) have their defaults.

Every other message is pickled whole (``P``), with multiprocessing's pickler. Which
fields the binary forms carry is written once (``_TASK_FIELDS``, ``_BATCH_FIELDS``): a
field added to a message later travels pickled until the binary form learns it.

Freed slots are the process pool's own business: no message names them. A worker's
reader hands them to its arena as it reads their frame (``FrameReader``'s
``on_released``), in order or reading ahead for room, so they take one route.

Frames are read off a pipe by :class:`~.frames.FrameReader`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import struct
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

from .._task.protocol import BatchDone, Task, builder
from .._transport.arena import SlotInfo
from .._transport.codec import SlotPayload

_LENGTH = struct.Struct("<Q")
# epoch, seq, first_sample, flags, released count, then released ids, then the index pickle
_TASK = struct.Struct("<qqqBI")
_COUNT = struct.Struct("<I")  # how many slot ids follow (R frames, and before a P task)
_ID = struct.Struct("<q")  # one slot id
_TASK_TRACE, _TASK_WANT_STATE, _TASK_CONSECUTIVE = 1, 2, 4
_RUN = struct.Struct("<qq")  # a consecutive index: its first value and length
# A whole T frame, length first, of a consecutive index and no slots, or one (one pack).
_PLAIN_RUN = struct.Struct("<QB" + _TASK.format[1:] + _RUN.format[1:])
_PLAIN_RUN_1 = struct.Struct("<QB" + _TASK.format[1:] + "q" + _RUN.format[1:])
# epoch, seq, busy_s, started, fetch_s, collate_s, encode_s, slot id, slot offset, slot
# size, layout count, retired count, plain
_BATCH = struct.Struct("<qqdddddqqqII?")
_PAYLOAD_AT = 1 + struct.calcsize("<qqddddd")  # where the slot's fields begin in a B body
_KIND_TASK, _KIND_BATCH, _KIND_PICKLE, _KIND_RELEASED = b"T", b"B", b"P", b"R"
_KIND_PICKLED_TASK = b"Q"  # a task with excluded indices or places, pickled, and slots
_BYTE_BATCH, _BYTE_TASK = _KIND_BATCH[0], _KIND_TASK[0]

# What the binary forms carry, and the fields they leave out (which must then have their
# defaults: see encode, whose per-batch checks name them, cheaper than a loop over them).
_CARRIED: dict[type, tuple[set[str], list[str]]] = {
    Task: (
        {"epoch", "seq", "index", "trace", "first_sample", "want_state", "consecutive"},
        ["exclude", "places"],
    ),
    BatchDone: (
        {"epoch", "seq", "payload", "busy_s", "started", "fetch_s", "collate_s", "encode_s"},
        ["skipped", "state", "epoch_state", "asked_worker_info"],
    ),
    SlotPayload: ({"slot", "meta", "layout", "retired", "plain"}, []),
}  # fmt: skip
for _kind, (_carried, _checked) in _CARRIED.items():
    # A field added to a message and known to neither would be dropped on one path only.
    if [f.name for f in dataclasses.fields(_kind) if f.name not in _carried] != _checked:
        raise TypeError(f"{_kind.__name__} has a field the wire's binary form does not know")


# Called with the slot ids a frame carries, and whether they came alone (an R frame).
Released = Callable[[tuple[int, ...], bool], None]


def encode(message: Any) -> bytes:
    """One whole frame (length included) for ``message`` (a task: :func:`encode_task`)."""
    if type(message) is Task:
        return encode_task(message)
    if (
        type(message) is BatchDone
        and type(message.payload) is SlotPayload
        and not message.skipped
        and message.state is None
        and message.epoch_state is None
        and message.asked_worker_info is None
    ):
        body = _encode_batch(message)
    else:
        body = _KIND_PICKLE + bytes(ForkingPickler.dumps(message))
    return _LENGTH.pack(len(body)) + body


def encode_task(task: Task, released: tuple[int, ...] = ()) -> bytes:
    """The frame of ``task``, carrying the slots ``released`` since the last frame."""
    if task.exclude or task.places:
        pickled = bytes(ForkingPickler.dumps(task))
        if not released:
            body = _KIND_PICKLE + pickled
        else:
            count = _COUNT.pack(len(released))
            body = b"".join((_KIND_PICKLED_TASK, count, _ids(released), pickled))
        return _LENGTH.pack(len(body)) + body
    flags = (_TASK_TRACE if task.trace else 0) | (_TASK_WANT_STATE if task.want_state else 0)
    index = task.index
    if task.consecutive and index:
        flags |= _TASK_CONSECUTIVE
        if not released:  # the commonest tasks (a sequential sampler's): one pack
            return _PLAIN_RUN.pack(
                _PLAIN_RUN.size - _LENGTH.size, _BYTE_TASK, task.epoch, task.seq,
                task.first_sample, flags, 0, index[0], len(index),
            )  # fmt: skip
        if len(released) == 1:
            return _PLAIN_RUN_1.pack(
                _PLAIN_RUN_1.size - _LENGTH.size, _BYTE_TASK, task.epoch, task.seq,
                task.first_sample, flags, 1, released[0], index[0], len(index),
            )  # fmt: skip
        packed = _RUN.pack(index[0], len(index))
    else:
        packed = pickle.dumps(index, pickle.HIGHEST_PROTOCOL)
    head = _TASK.pack(task.epoch, task.seq, task.first_sample, flags, len(released))
    ids = _ID.pack(released[0]) if len(released) == 1 else _ids(released)
    size = 1 + _TASK.size + len(ids) + len(packed)
    return b"".join((_LENGTH.pack(size), _KIND_TASK, head, ids, packed))


def encode_released(released: tuple[int, ...]) -> bytes:
    """A frame of freed slots alone (no task is going to their worker)."""
    body = b"".join((_KIND_RELEASED, _COUNT.pack(len(released)), _ids(released)))
    return _LENGTH.pack(len(body)) + body


def _ids(released: tuple[int, ...]) -> bytes:
    return struct.pack(f"<{len(released)}q", *released) if released else b""


def _encode_batch(message: BatchDone) -> bytes:
    payload: SlotPayload = message.payload
    slot, layout, retired = payload.slot, payload.layout, payload.retired
    head = _BATCH.pack(
        message.epoch,
        message.seq,
        message.busy_s,
        message.started,
        message.fetch_s,
        message.collate_s,
        message.encode_s,
        slot.slot_id,
        slot.offset,
        slot.size,
        len(layout),
        len(retired),
        payload.plain,
    )
    pairs = struct.pack(f"<{2 * len(layout)}q", *itertools.chain.from_iterable(layout))
    ids = struct.pack(f"<{len(retired)}q", *retired) if retired else b""
    return b"".join((_KIND_BATCH, head, pairs, ids, payload.meta))


class BodyDecoder:
    """Bodies back into messages (keeps the slots it has seen: they are reused).
    ``on_released`` is given the freed slots a frame carries (a worker's reader)."""

    def __init__(self, on_released: Released | None = None) -> None:
        self._slots: dict[tuple[int, int, int], SlotInfo] = {}
        self._payloads: dict[bytes, SlotPayload] = {}
        self._on_released = on_released

    def decode(self, body: memoryview) -> Any:
        """The message of a frame; None for a frame of freed slots alone."""
        kind = body[:1]
        if kind == _KIND_TASK:
            return self._decode_task(body)
        if kind == _KIND_BATCH:
            return self.decode_batch(body)
        if kind == _KIND_PICKLE:
            return pickle.loads(body[1:])
        if kind in (_KIND_RELEASED, _KIND_PICKLED_TASK):
            (count,) = _COUNT.unpack_from(body, 1)
            ids = struct.unpack_from(f"<{count}q", body, 1 + _COUNT.size)
            self._released(ids, kind == _KIND_RELEASED)
            at = 1 + _COUNT.size + 8 * count
            return pickle.loads(body[at:]) if kind == _KIND_PICKLED_TASK else None
        raise ValueError(f"unknown frame kind {bytes(kind)!r} on a conveyor worker pipe")

    def _released(self, released: tuple[int, ...], alone: bool) -> None:
        if released and self._on_released is not None:
            self._on_released(released, alone)

    def _decode_task(self, body: memoryview) -> Task:
        epoch, seq, first_sample, flags, n_released = _TASK.unpack_from(body, 1)
        at = 1 + _TASK.size
        if n_released:
            self._released(struct.unpack_from(f"<{n_released}q", body, at), False)
            at += 8 * n_released
        consecutive = bool(flags & _TASK_CONSECUTIVE)
        if consecutive:
            first, length = _RUN.unpack_from(body, at)
            index = list(range(first, first + length))  # the list the sampler yielded
        else:
            index = pickle.loads(body[at:])
        task = _new(Task)  # (once a batch: without the frozen __init__, see decode_batch)
        task.__dict__.update(
            _TASK_DEFAULTS,
            epoch=epoch,
            seq=seq,
            index=index,
            trace=bool(flags & _TASK_TRACE),
            first_sample=first_sample,
            want_state=bool(flags & _TASK_WANT_STATE),
            consecutive=consecutive,
        )
        return task

    def decode_batch(self, body: memoryview) -> BatchDone:
        """A ``B`` frame's message (see :meth:`decode`)."""
        epoch, seq, busy, started, fetch_s, collate_s, encode_s, *rest = _BATCH.unpack_from(body, 1)
        if rest[4]:  # slots retired: a payload of its own
            payload = self._payload(body, rest)
        else:
            # A worker fills the same slots with batches of the same structure: the
            # payload (slot, layout, pickle) is looked up by its bytes, not decoded.
            key = bytes(body[_PAYLOAD_AT:])
            known = self._payloads.get(key)
            if known is None:
                known = self._payload(body, rest)
                if len(self._payloads) >= _KNOWN_PAYLOADS:
                    self._payloads.clear()
                self._payloads[key] = known
            payload = known
        # Made without its frozen __init__ (see protocol.builder), its fields given
        # whole: once a batch.
        done = _new(BatchDone)
        fields = _DONE_DEFAULTS.copy()
        fields["epoch"], fields["seq"], fields["payload"] = epoch, seq, payload
        fields["busy_s"], fields["started"], fields["fetch_s"] = busy, started, fetch_s
        fields["collate_s"], fields["encode_s"] = collate_s, encode_s
        _set(done, "__dict__", fields)
        return done

    def _payload(self, body: memoryview, head: list[Any]) -> SlotPayload:
        """The :class:`SlotPayload` of a ``B`` frame, given its head's slot fields."""
        slot_id, offset, size, n_layout, n_retired, plain = head
        at = 1 + _BATCH.size
        numbers = struct.unpack_from(f"<{2 * n_layout}q", body, at)
        layout = tuple(zip(numbers[::2], numbers[1::2], strict=True))
        at += 16 * n_layout
        retired = struct.unpack_from(f"<{n_retired}q", body, at) if n_retired else ()
        at += 8 * n_retired
        key = (slot_id, offset, size)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = SlotInfo(slot_id, offset, size)
        return _slot_payload(
            slot=slot, meta=bytes(body[at:]), layout=layout, retired=retired, plain=plain
        )


_new = object.__new__
_set = object.__setattr__
_slot_payload = builder(SlotPayload)
# Payloads a decoder keeps: a worker's slots times its batches' structures (one each,
# mostly; a batch of varying shapes has many, and replaces them all as they come).
_KNOWN_PAYLOADS = 1024
_TASK_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(Task)
    if f.default is not dataclasses.MISSING and f.name not in _CARRIED[Task][0]
}
_DONE_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(BatchDone)
    if f.default is not dataclasses.MISSING and f.name not in _CARRIED[BatchDone][0]
}


def send(fd: int, message: Any) -> None:
    """Write one message to a blocking descriptor (the worker's side), whole."""
    frame = encode(message)
    written = os.write(fd, frame)
    if written < len(frame):  # (a pipe takes a whole frame of up to 64 KiB at once)
        with memoryview(frame) as data:
            while written < len(frame):
                written += os.write(fd, data[written:])
