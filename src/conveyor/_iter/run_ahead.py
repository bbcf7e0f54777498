"""How many tasks beyond ``prefetch`` each worker may take: small, quick batches run ahead.

torch keeps ``prefetch_factor`` tasks out per worker; with cheap samples on few
cores a worker's queue then runs dry whenever the main process falls one batch
behind (docs/design.md, "Run-ahead"). A pure object kept by the task book, told
what came back (a batch's slot size and the worker's time on it, a reply of an
abandoned epoch, a worker replaced, every slot of a worker in use).
"""

from __future__ import annotations

from .._transport.arena import RUN_AHEAD_BATCH_S, run_ahead
from .._workers.api import BatchHandle
from . import messages

SLOTS_BEYOND_PREFETCH = 4  # batches the user may hold before the pipe fallback


class RunAhead:
    def __init__(self, num_workers: int, prefetch: int, budget: int = 0) -> None:
        """``budget``: each worker's share of the run-ahead bytes (0: never beyond
        ``prefetch``, as torch)."""
        self.budget = budget
        self._base_slots = prefetch + SLOTS_BEYOND_PREFETCH
        self._told_slots_held = False
        self.start_epoch([0] * num_workers)

    def add_worker(self) -> None:
        self.stale.append(0)

    def start_epoch(self, stale: list[int]) -> None:
        """An epoch starts with prefetch alone: after a break, the slots of the last
        epoch's tasks still out (``stale``, per worker) must come back first."""
        self.stale = stale
        self.extra = 0  # tasks per worker beyond prefetch
        self.slot_bytes = 0  # of the last batch: the run-ahead is decided when it changes

    def batch(self, slot_bytes: int, busy_s: float) -> None:
        """A batch came in a slot of another size than the last: decided again.

        Decided when the slots' size changes, which is rarely (batches alike): how many
        tasks are out at a break then does not depend on timing, so the random draws
        of the tasks left over, and of the next epoch, repeat from run to run. Only for
        batches that took under RUN_AHEAD_BATCH_S (the work left over after a break
        stays short), and not while slots of an abandoned epoch are still to come."""
        if busy_s > RUN_AHEAD_BATCH_S or any(self.stale):
            return
        self.slot_bytes = slot_bytes
        self.extra = run_ahead(slot_bytes, self._base_slots, self.budget)

    def stale_reply(self, worker_id: int) -> None:
        """A reply of an abandoned epoch came (its slot is given back)."""
        self.stale[worker_id] = max(0, self.stale[worker_id] - 1)

    def replaced(self, worker_id: int) -> None:
        """A worker died: its abandoned tasks will never be answered."""
        self.stale[worker_id] = 0

    def allow(self, per_worker: int) -> None:
        self.extra = per_worker

    def held(self, worker_id: int, batch: BatchHandle) -> str | None:
        """The warning for a batch that came through its worker's pipe, every slot being
        in use, if the user should be told (see :meth:`slots_exhausted`)."""
        held_in_worker = batch.held_in_worker
        if self.slots_exhausted(held_in_worker, batch.batches_alive()):
            return messages.slots_held(worker_id, held_in_worker)
        return None

    def slots_exhausted(self, held_in_worker: int, held_by_loop: int) -> bool:
        """A worker found every slot in use and sent a batch through its pipe; True when
        the user should be told (once): arrays the worker keeps, or batches the loop
        keeps, hold them. Otherwise batches that wait to be handed out filled them (a
        worker running ahead, batches that keep growing): the run-ahead is withdrawn,
        and the next batch size decides it again."""
        if not held_in_worker and held_by_loop < SLOTS_BEYOND_PREFETCH:
            self.extra = 0
            return False
        told, self._told_slots_held = self._told_slots_held, True
        return not told
