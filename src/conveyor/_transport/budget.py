"""How many slots a worker may hold: its share of its loader's budget (the process
pool's own business; the book only hears how far a worker may run ahead).

Small, quick batches run further ahead than ``prefetch_factor``: a worker whose queue
never runs dry never sleeps, and on few cores a sleep and wake-up costs as much as the
batch. A loader's workers share RUN_AHEAD_BYTES of slots for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor._task.protocol import HELD_BEYOND_PREFETCH

__all__ = ["MAX_RUN_AHEAD", "RUN_AHEAD_BYTES", "SlotBudget", "run_ahead", "run_ahead_bytes"]

RUN_AHEAD_BYTES = 16 << 20
MAX_RUN_AHEAD = 256  # tasks per worker beyond prefetch, whatever the budget allows


def run_ahead_bytes(num_workers: int) -> int:
    """Each worker's share of RUN_AHEAD_BYTES."""
    return RUN_AHEAD_BYTES // max(1, num_workers)


@dataclass(frozen=True)
class SlotBudget:
    """How many slots a worker may have: ``max_slots`` of any size (its prefetched
    tasks' batches and a few the loop keeps), and more while they all fit
    ``run_ahead_bytes`` (small batches that run ahead, or that the loop keeps)."""

    max_slots: int = 0
    run_ahead_bytes: int = 0

    @classmethod
    def for_loader(cls, prefetch: int, num_workers: int, run_ahead: bool) -> SlotBudget:
        """Each worker's, for ``num_workers`` workers taking ``prefetch`` tasks each."""
        share = run_ahead_bytes(num_workers) if run_ahead else 0
        return cls(prefetch + HELD_BEYOND_PREFETCH, share)


def run_ahead(slot_bytes: int, base_slots: int, budget: int) -> int:
    """Tasks a worker may take beyond prefetch for batches in slots of ``slot_bytes``,
    when it keeps ``base_slots`` slots without running ahead and all of its slots must
    fit ``budget`` bytes (see RUN_AHEAD_BYTES)."""
    fit = budget // max(slot_bytes, 1) - base_slots
    return max(0, min(MAX_RUN_AHEAD, fit))
