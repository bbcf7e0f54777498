"""What the process pool can say of its workers without asking them: their pids,
what each is doing (its status page), its stacks, its CPU time and memory, how many
batches hold their memory (``Abilities.inspect`` and ``usage``), and how far each may
run ahead (``Abilities.run_ahead``, from the slot a batch came in)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from .._task.protocol import GONE, RoomAhead, WorkerStatus
from .._transport.budget import SlotBudget, run_ahead
from .._transport.codec import InlinePayload, SlotPayload
from .._transport.decoder import PayloadHandle
from .api import BatchHandle
from .process import Worker
from .stacks import active_s, dump_stacks, process_uss, thread_stack
from .status import read_status

__all__ = ["Readings", "RoomsAhead"]


class Readings:
    """The pool's readings of its workers (WorkerPool's base: it keeps these)."""

    _workers: list[Worker]
    _let_go: set[int]  # ids stopped for good (num_workers="auto")
    _dead: set[int]  # cores whose process's death was reported, not restarted
    _killed: dict[int, int]  # a process the pool killed (its pid) -> for which core

    def pids(self) -> list[int | None]:
        """Each core's process (several cores share one with threads_per_worker)."""
        return [None if i in self._let_go else w.pid for i, w in enumerate(self._workers)]

    def status(self, worker_id: int) -> WorkerStatus:
        """Gone (retired, dead, or killed and dying) reads as idle: the deadlines never
        count against a worker that is no longer there."""
        worker = self._workers[worker_id]
        if worker_id in self._let_go or worker_id in self._dead or worker.pid in self._killed:
            return GONE
        return read_status(worker.arena.status_page)

    def stacks(self, worker_id: int, timeout: float = 2.0) -> str:
        worker = self._workers[worker_id]
        if worker.process.exitcode is not None:
            return ""
        stacks = dump_stacks(worker.pid, worker.host.stacks, timeout)
        if len(worker.host.cores) == 1:
            return stacks
        return thread_stack(stacks, read_status(worker.arena.status_page).thread)

    # --- what workers use (Abilities.usage) ------------------------------------------

    def active_s(self, worker_id: int) -> float | None:
        worker = self._workers[worker_id]
        if len(worker.host.cores) == 1:
            return active_s(worker.pid)
        return active_s(worker.pid, read_status(worker.arena.status_page).native_id or None)

    def memory_bytes(self, worker_id: int) -> int | None:
        """The process's USS, counted at its first core (0 at the others: shared)."""
        worker = self._workers[worker_id]
        if worker_id != worker.host.cores[0]:
            return 0
        return process_uss(worker.pid)

    def in_memory(self, batches: Iterable[BatchHandle]) -> int:
        waiting = sum(1 for b in batches if type(cast(PayloadHandle, b).payload) is SlotPayload)
        return waiting + sum(worker.decoder.batches_alive for worker in self._workers)


class RoomsAhead:
    """How far a worker may run ahead, judged from a batch it sent (see api.Abilities):
    for batches in slots of its size, as many tasks as its share of the run-ahead budget
    holds (the same answer for the same size, made once); or, for one that came through
    the pipe because every slot was in use, who holds them."""

    def __init__(self, budget: SlotBudget) -> None:
        self._budget = budget
        self._rooms: dict[int, RoomAhead] = {}  # by slot size

    def __call__(self, batch: BatchHandle) -> RoomAhead | None:
        handle: PayloadHandle = batch  # type: ignore[assignment]  # (once a batch: no cast)
        payload = handle.payload
        if type(payload) is SlotPayload:
            budget = self._budget
            if not budget.run_ahead_bytes:
                return None
            size = payload.slot.size
            room = self._rooms.get(size)
            if room is None:
                extra = run_ahead(size, budget.max_slots, budget.run_ahead_bytes)
                room = self._rooms[size] = RoomAhead(size, extra)
            return room
        if type(payload) is InlinePayload and payload.slots_exhausted:
            alive = handle.decoder.batches_alive
            return RoomAhead(full=True, held_in_worker=payload.held_in_worker, held_by_loop=alive)
        return None
