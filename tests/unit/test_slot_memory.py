"""A worker's slots hold no more memory than its batches need (issue 40): a slot freed by a
frame not yet read is reclaimed before another is added, and the pages of free slots go
back to the system once the worker waits for its next task long enough."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from conveyor._task.protocol import Task
from conveyor._transport.arena import PAGE, WorkerArena, create_arena_fd
from conveyor._workers import inbox as inbox_module
from conveyor._workers import wire
from conveyor._workers.inbox import Inbox

MIB = 1 << 20


def _allocated(fd: int) -> int:
    """Bytes of the memfd the kernel holds pages for."""
    return os.fstat(fd).st_blocks * 512


@pytest.fixture
def arena() -> Any:
    fd = create_arena_fd(0)
    yield WorkerArena(fd, max_slots=4)
    os.close(fd)


def _fill(arena: WorkerArena, nbytes: int) -> int:
    """Acquire a slot, write ``nbytes`` into it, let the worker's view go; its id."""
    acquired = arena.acquire(nbytes)
    assert acquired is not None
    slot, view = acquired
    view[:nbytes] = 7
    del view, acquired
    return slot.slot_id


def test_a_slot_freed_by_a_frame_not_yet_read_is_reused_not_added(arena: WorkerArena) -> None:
    first = _fill(arena, 2 * MIB)  # held by the main process until it says otherwise
    calls: list[int] = []

    def reclaim() -> bool:  # the frame that frees it was sent, not yet read
        calls.append(first)
        arena.release((first,))
        return True

    arena.reclaim = reclaim
    assert _fill(arena, 2 * MIB) == first
    assert calls == [first] and len(arena._slots) == 1


def test_without_a_freed_slot_waiting_a_slot_is_added(arena: WorkerArena) -> None:
    first = _fill(arena, 2 * MIB)
    arena.reclaim = lambda: False
    assert _fill(arena, 2 * MIB) != first and len(arena._slots) == 2


def test_idle_slots_give_their_pages_back_and_reserve_them_again(arena: WorkerArena) -> None:
    held = _fill(arena, 2 * MIB)
    free = _fill(arena, 3 * MIB)
    arena.release((free,))
    before = _allocated(arena._fd)
    assert arena.idle_bytes() >= 3 * MIB
    arena.drop_idle_pages()
    assert arena.idle_bytes() == 0
    assert before - _allocated(arena._fd) >= 3 * MIB - PAGE  # the free slot's, not the held
    assert _allocated(arena._fd) >= 2 * MIB
    # Reused, the slot is reserved again as it is written, and reads what was written.
    acquired = arena.acquire(3 * MIB)
    assert acquired is not None and acquired[0].slot_id == free
    acquired[1][: 3 * MIB] = 9
    assert int(acquired[1][3 * MIB - 1]) == 9 and _allocated(arena._fd) >= 5 * MIB
    assert held != free


def test_small_free_slots_keep_their_pages(arena: WorkerArena) -> None:
    free = _fill(arena, 64 << 10)
    arena.release((free,))
    before = _allocated(arena._fd)
    arena.drop_idle_pages()
    assert arena.idle_bytes() == 0 and _allocated(arena._fd) == before


def test_a_worker_waiting_for_a_task_gives_idle_pages_back_then_serves_it(
    arena: WorkerArena, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inbox_module, "IDLE_S", 0.0)  # (a long wait, as far as it knows)
    free = _fill(arena, 3 * MIB)
    r, w = os.pipe()
    inbox = Inbox(r, arena)
    dropped = threading.Event()
    drop = arena.drop_idle_pages

    def dropping() -> None:
        drop()
        dropped.set()

    arena.drop_idle_pages = dropping  # type: ignore[method-assign]
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(inbox.recv()))
    try:
        thread.start()
        os.write(w, wire.encode_released((free,)))  # freed while it waits: its pages go
        assert dropped.wait(10)
        task = Task(0, 3, [1, 2])
        os.write(w, wire.encode_task(task))
        thread.join(10)
        assert got == [task]
        assert arena.idle_bytes() == 0
    finally:
        os.close(w)
        thread.join(10)
        os.close(r)


def test_a_busy_worker_keeps_its_free_slots_pages(arena: WorkerArena) -> None:
    free = _fill(arena, 3 * MIB)
    r, w = os.pipe()
    try:
        inbox = Inbox(r, arena)
        task = Task(0, 3, [1, 2])
        os.write(w, wire.encode_released((free,)) + wire.encode_task(task))
        assert inbox.recv() == task  # its next task was there: nothing is given back
        assert arena.idle_bytes() >= 3 * MIB
    finally:
        os.close(w)
        os.close(r)


def test_released_slots_hold_no_value_a_batch_still_reads(arena: WorkerArena) -> None:
    """Only free slots (neither side uses them) lose their pages (invariant 7)."""
    acquired = arena.acquire(2 * MIB)
    assert acquired is not None
    slot, view = acquired
    view[: 2 * MIB] = 5
    arena.release((slot.slot_id,))  # the main process is done; the worker's view lives on
    arena.drop_idle_pages()
    assert np.all(view[: 2 * MIB] == 5)
