"""The main process's end of a task pipe: never blocks, keeps order, loses nothing."""

from __future__ import annotations

import os

import pytest

from conveyor._task.protocol import Task
from conveyor._workers.frames import FrameReader
from conveyor._workers.outbox import Outbox


@pytest.fixture
def pipe():
    r, w = os.pipe()
    os.set_blocking(r, False)
    yield r, w
    os.close(r)
    os.close(w)


def _drain(reader: FrameReader) -> list[Task]:
    got: list[Task] = []
    while True:
        batch = reader.read()
        if not batch:
            return got
        got += batch


def test_a_full_pipe_queues_tasks_and_they_arrive_whole_and_in_order(pipe) -> None:
    r, w = pipe
    outbox = Outbox(w)
    sent = 0
    while not outbox.pending:  # until the pipe is full
        outbox.send(Task(0, sent, list(range(sent, sent + 256))))
        sent += 1
    reader = FrameReader(r)
    got = _drain(reader)  # the pipe has room again: the next send writes the queue
    outbox.send(Task(0, sent, [sent]))
    sent += 1
    while not outbox.flush():
        got += _drain(reader)
    got += _drain(reader)
    assert [task.seq for task in got] == list(range(sent))
    assert got[3].index == list(range(3, 259))
