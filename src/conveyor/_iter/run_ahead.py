"""How many tasks beyond ``prefetch`` each worker may take: small, quick batches run ahead.

torch keeps ``prefetch_factor`` tasks out per worker; with cheap samples on few
cores a worker's queue then runs dry whenever the main process falls one batch
behind (docs/design.md, "Run-ahead"). How far the workers' memory allows is their
pool's to say (``Abilities.run_ahead``: the process pool answers from its slots, as a
:class:`~conveyor._task.protocol.RoomAhead`); when to follow it is decided here, in a pure
object kept by the task book, told what came back (that answer and the worker's time
on the batch, a reply of an abandoned epoch, a worker replaced).
"""

from __future__ import annotations

from conveyor._task.protocol import HELD_BEYOND_PREFETCH, RoomAhead

# A worker runs ahead only while its batches take under this long: the work left over
# after a ``break`` stays short.
RUN_AHEAD_BATCH_S = 0.001


class RunAhead:
    def __init__(self, num_workers: int) -> None:
        self._told_held = False
        self.start_epoch([0] * num_workers)

    def add_worker(self) -> None:
        self.stale.append(0)

    def start_epoch(self, stale: list[int]) -> None:
        """An epoch starts with prefetch alone: after a break, the memory of the last
        epoch's tasks still out (``stale``, per worker) must come back first."""
        self.stale = stale
        self.extra = 0  # tasks per worker beyond prefetch
        self.size = 0  # what the last batch decided by took: decided again when it changes

    def batch(self, room: RoomAhead, busy_s: float) -> None:
        """A batch came whose pool says how far its worker may run ahead.

        Decided when the batches' size changes, which is rarely (batches alike): how many
        tasks are out at a break then does not depend on timing, so the random draws of
        the tasks left over, and of the next epoch, repeat from run to run. Only for
        batches that took under RUN_AHEAD_BATCH_S (the work left over after a break
        stays short), and not while an abandoned epoch's replies are still to come."""
        if not room.size or room.size == self.size:
            return
        if busy_s > RUN_AHEAD_BATCH_S or any(self.stale):
            return
        self.size = room.size
        self.extra = room.extra

    def stale_reply(self, worker_id: int) -> None:
        """A reply of an abandoned epoch came (its memory is given back)."""
        self.stale[worker_id] = max(0, self.stale[worker_id] - 1)

    def replaced(self, worker_id: int) -> None:
        """A worker died: its abandoned tasks will never be answered."""
        self.stale[worker_id] = 0

    def allow(self, per_worker: int) -> None:
        self.extra = per_worker

    def held(self, room: RoomAhead) -> bool:
        """A batch came another way, every piece of its worker's memory in use (``room``
        says who holds them); True when the user should be told (see
        :meth:`slots_exhausted`)."""
        return self.slots_exhausted(room.held_in_worker, room.held_by_loop)

    def slots_exhausted(self, held_in_worker: int, held_by_loop: int) -> bool:
        """A worker found its memory in use and sent a batch through its pipe; True when
        the user should be told (once): arrays the worker keeps, or batches the loop
        keeps, hold it. Otherwise batches that wait to be handed out filled it (a
        worker running ahead, batches that keep growing): the run-ahead is withdrawn,
        and the next batch size decides it again."""
        if not held_in_worker and held_by_loop < HELD_BEYOND_PREFETCH:
            self.extra = 0
            return False
        told, self._told_held = self._told_held, True
        return not told
