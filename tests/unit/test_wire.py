"""Frames on the worker pipes: every message round-trips, however the bytes arrive."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import typing
from collections.abc import Iterator

import numpy as np
import pytest

from conveyor._task.dataset_calls import DatasetCall
from conveyor._task.protocol import (
    BatchDone,
    MainMessage,
    Ready,
    SampleFailed,
    Stage,
    Stop,
    Task,
    WorkerMessage,
)
from conveyor._transport.arena import SlotInfo
from conveyor._transport.codec import InlinePayload, SlotPayload
from conveyor._workers import frames, wire
from conveyor._workers.remote_error import capture
from conveyor.errors import Culprit

SLOT = SlotInfo(3, 4096, 65536)
MESSAGES = [
    Task(0, 5, list(range(256))),
    Task(2, 7, [np.int64(4), 9], trace=True, first_sample=12, want_state=True),
    Task(1, 1, 17),  # batch_size=None: a single index
    Task(1, 2, ["a", ("b", 3)], exclude=("b",)),  # excluded indices: pickled whole
    BatchDone(0, 5, SlotPayload(SLOT, b"meta", ((0, 8), (64, 16)), (0, 1)), (), 0.25),
    BatchDone(0, 6, SlotPayload(SLOT, b"", (), ()), (), 0.0),
    BatchDone(0, 6, SlotPayload(SLOT, b"m", ((0, 8),), (), plain=True), (), 0.5),
    BatchDone(0, 7, InlinePayload(b"x" * 10, slots_exhausted=True, held_in_worker=2)),
    BatchDone(0, 8, None, (SampleFailed(3, Stage.FETCH, capture(KeyError("k"))),)),
    BatchDone(0, 9, SlotPayload(SLOT, b"m", ((0, 8),)), state=b"state"),
    Task(3, 4, list(range(1000, 1256)), consecutive=True),  # a sequential sampler's
    Task(2, 8, [3, 9], first_sample=12, places=(101, 7)),  # a rank sharding the epoch
    Ready(1, 1234, b"state"),
    Stop(),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: object) -> None:
    frame = wire.encode(message)
    decoded = wire.BodyDecoder().decode(memoryview(frame)[8:])
    if isinstance(message, BatchDone) and message.skipped:
        assert decoded.skipped[0].error.message == message.skipped[0].error.message
        return
    assert decoded == message


def test_a_consecutive_index_travels_as_two_numbers_and_comes_back_a_list() -> None:
    index = list(range(10**9, 10**9 + 256))
    plain, run = Task(0, 1, index), Task(0, 1, index, consecutive=True)
    assert len(wire.encode(run)) < 100 < len(wire.encode(plain))
    back = wire.BodyDecoder().decode(memoryview(wire.encode(run))[8:])
    assert type(back.index) is list and back.index == index
    assert all(type(i) is int for i in back.index)


@pytest.mark.parametrize(
    "task",
    [
        Task(0, 5, list(range(256))),
        Task(0, 5, list(range(7, 263)), first_sample=7, consecutive=True, want_state=True),
        Task(1, 2, ["a", ("b", 3)], exclude=("b",)),
    ],
    ids=["fixed layout", "consecutive", "pickled"],
)
@pytest.mark.parametrize("released", [(), (4,), (4, 9)], ids=["none", "one", "two"])
def test_freed_slots_ride_in_a_tasks_frame_or_alone_and_reach_the_reader(
    task: Task, released: tuple[int, ...]
) -> None:
    freed: list[tuple[tuple[int, ...], bool]] = []
    decoder = wire.BodyDecoder(on_released=lambda ids, alone: freed.append((ids, alone)))
    frame = wire.encode_task(task, released)
    assert wire._LENGTH.unpack_from(frame)[0] == len(frame) - 8
    back = decoder.decode(memoryview(frame)[8:])
    assert back == task  # no message names a slot: the frame carries them
    assert decoder.decode(memoryview(wire.encode_released((5, 6, 7)))[8:]) is None
    assert freed == [*([(released, False)] if released else []), ((5, 6, 7), True)]


def test_a_frame_of_freed_slots_alone_is_no_message_to_read(pipe: tuple[int, int]) -> None:
    r, w = pipe
    written = [wire.encode_released((1,)), wire.encode(Stop()), wire.encode_released((2, 3))]
    os.write(w, b"".join(written) + wire.encode_task(MESSAGES[0], (8,)))
    freed: list[tuple[int, ...]] = []
    reader = frames.FrameReader(r, on_released=lambda ids, alone: freed.append(ids))
    assert reader.recv() == Stop()  # the frame before it freed its slot, and is no message
    assert freed == [(1,)]
    assert reader.recv() == MESSAGES[0]
    assert freed == [(1,), (2, 3), (8,)]


def test_hot_messages_take_the_fixed_layout() -> None:
    task, batch = MESSAGES[0], MESSAGES[4]
    assert wire.encode(task)[8:9] == b"T"
    assert wire.encode(batch)[8:9] == b"B"
    assert wire.encode(MESSAGES[3])[8:9] == b"P"  # exclude: the rare case, pickled


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):  # closed by the test
            os.close(fd)


def test_one_read_takes_every_frame_the_pipe_holds(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.write(w, b"".join(wire.encode(m) for m in MESSAGES[:3]))
    reader = frames.FrameReader(r)
    assert reader.read() == MESSAGES[:3]
    assert reader.take() is None  # no whole frame left unread


def test_a_frame_split_across_reads_comes_whole(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.set_blocking(r, False)
    frame = wire.encode(MESSAGES[0])
    reader = frames.FrameReader(r)
    for cut in (3, 11, len(frame) - 1):  # inside the length, the body, the last byte
        os.write(w, frame[:cut])
        assert reader.read() == []
        assert reader.take() is None  # no whole frame left unread
        os.write(w, frame[cut:])
        assert reader.read() == [MESSAGES[0]]


def test_a_frame_larger_than_the_pipe_is_gathered_in_place(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.set_blocking(r, False)
    big = BatchDone(1, 2, InlinePayload(os.urandom(3 * frames.READ_SIZE + 123)))
    frame = wire.encode(big) + wire.encode(Stop())
    reader = frames.FrameReader(r)
    got: list[object] = []
    for start in range(0, len(frame), 40000):  # as a worker's writes arrive
        os.write(w, frame[start : start + 40000])
        while True:
            messages = reader.read()
            got += messages
            if not messages:
                break
    assert got == [big, Stop()]


def test_blocking_recv_and_end_of_file(pipe: tuple[int, int]) -> None:
    r, w = pipe
    wire.send(w, MESSAGES[1])
    wire.send(w, Stop())
    os.close(w)
    reader = frames.FrameReader(r)
    assert reader.recv() == MESSAGES[1]
    assert reader.recv() == Stop()
    with pytest.raises(EOFError):
        reader.recv()


def test_drain_returns_what_a_dead_writer_left(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.set_blocking(r, False)
    os.write(w, wire.encode(MESSAGES[4]) + wire.encode(MESSAGES[5])[:10])
    os.close(w)
    reader = frames.FrameReader(r)
    assert reader.drain() == [MESSAGES[4]]  # the half-written frame is dropped
    assert reader.eof


# --- every field of every message -------------------------------------------------------

_ERROR = capture(KeyError("k"))
# A value other than its default for each field name of any message (the test below fails
# on a message field missing here, so a field added later is tested too).
NON_DEFAULT: dict[str, object] = {
    "epoch": 3,
    "seq": 9,
    "index": [40, 41, 42],
    "trace": True,
    "exclude": (41,),
    "first_sample": 17,
    "want_state": True,
    "consecutive": True,
    "places": (40, 7, 93),
    "seed": 42,
    "calls": (
        DatasetCall("set_epoch", (3,)),
        DatasetCall("set_level", (np.int64(2), "hard"), (("step", 0.5),)),
    ),
    "worker_id": 2,
    "pid": 1234,
    "state": b"state",
    "payload": SlotPayload(SLOT, b"meta", ((0, 8), (64, 16)), (5, 6), plain=True),
    "skipped": (SampleFailed(41, Stage.FETCH, _ERROR),),
    "busy_s": 0.5,
    "started": 12345.25,
    "fetch_s": 0.125,
    "collate_s": 0.0625,
    "encode_s": 0.03125,
    "epoch_state": b"epoch state",
    "asked_worker_info": False,
    "stage": Stage.COLLATE,
    "error": _ERROR,
    "culprit": Culprit((41,)),
}


_BATCH_REST = {"skipped", "state", "epoch_state", "asked_worker_info"}  # pickled if set


def _message_classes() -> list[type]:
    return [*typing.get_args(MainMessage), *typing.get_args(WorkerMessage)]


def _filled(kind: type, only: set[str] | None = None) -> object:
    """``kind`` with every field (or those in ``only``) at a non-default value."""
    values = {}
    for f in dataclasses.fields(kind):
        if only is not None and f.name not in only:
            continue
        assert f.name in NON_DEFAULT, f"add a non-default value for {kind.__name__}.{f.name}"
        value = NON_DEFAULT[f.name]
        assert value != f.default, f"{kind.__name__}.{f.name}: {value!r} is its default"
        values[f.name] = value
    return kind(**values)


def _round_trip(message: object) -> tuple[bytes, object]:
    frame = wire.encode(message)
    return bytes(frame[8:9]), wire.BodyDecoder().decode(memoryview(frame)[8:])


@pytest.mark.parametrize("kind", _message_classes(), ids=lambda k: k.__name__)
def test_every_field_of_every_message_round_trips(kind: type) -> None:
    message = _filled(kind)
    _, back = _round_trip(message)
    assert back == message


@pytest.mark.parametrize(
    ("kind", "frame_kind", "fields"),
    [
        (Task, b"T", {f.name for f in dataclasses.fields(Task)} - {"exclude", "places"}),
        (
            BatchDone,
            b"B",
            {"epoch", "seq", "payload", "busy_s", "started", "fetch_s", "collate_s", "encode_s"},
        ),
    ],
    ids=["Task", "BatchDone"],
)
def test_every_field_a_binary_form_carries_round_trips(
    kind: type, frame_kind: bytes, fields: set[str]
) -> None:
    message = _filled(kind, fields)
    sent_as, back = _round_trip(message)
    assert sent_as == frame_kind  # the per-batch form, not a pickle
    assert back == message


def test_a_batch_frames_payload_is_looked_up_by_its_bytes_and_slots_retired_are_never_shared() -> (
    None
):
    """A worker refills its slots with batches of one structure: their payloads are decoded
    once. One that names retired slots is decoded whole (the arena forgets them once)."""
    decoder = wire.BodyDecoder()

    def decoded(message: BatchDone) -> BatchDone:
        back = decoder.decode(memoryview(wire.encode(message))[8:])
        assert back == message
        return back  # type: ignore[no-any-return]

    plain = SlotPayload(SLOT, b"m", ((0, 8), (64, 16)), plain=True)
    first, second = decoded(BatchDone(0, 1, plain, busy_s=0.5)), decoded(BatchDone(0, 2, plain))
    assert first.payload is second.payload and (first.seq, second.seq) == (1, 2)
    other = decoded(BatchDone(0, 3, SlotPayload(SLOT, b"n", ((0, 8), (64, 16)), plain=True)))
    assert other.payload is not first.payload and other.payload.meta == b"n"
    retiring = SlotPayload(SLOT, b"m", ((0, 8), (64, 16)), retired=(4,), plain=True)
    assert (
        decoded(BatchDone(0, 4, retiring)).payload is not decoded(BatchDone(0, 5, retiring)).payload
    )
    for seq in range(wire._KNOWN_PAYLOADS + 5):  # as many slots as never recur: bounded
        decoded(BatchDone(0, seq, SlotPayload(SlotInfo(seq, 4096 * seq, 4096), b"m", ((0, 8),))))
    assert len(decoder._payloads) <= wire._KNOWN_PAYLOADS
