"""Summing the stages' seconds as batches pass, per epoch and over the loader's life.

Pure bookkeeping, fed by the loops: no clock of its own (time is an argument). Only
running totals are kept, one set for the loader's life; an epoch's figures are the
totals less what they were when it began, so each batch costs one set of additions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from ..records import StageTimes

__all__ = ["StageClock", "WorkerAccount"]


class WorkerAccount(Protocol):
    """A worker's account of its time on a task, as its reply carries it."""

    @property
    def busy_s(self) -> float: ...
    @property
    def fetch_s(self) -> float: ...
    @property
    def collate_s(self) -> float: ...
    @property
    def encode_s(self) -> float: ...


@dataclass
class _Totals:
    batches: int = 0
    samples: int = 0
    fetch_s: float = 0.0
    collate_s: float = 0.0
    send_s: float = 0.0
    busy_s: float = 0.0
    decode_s: float = 0.0
    pin_s: float = 0.0
    wait_s: float = 0.0
    bytes: int = 0


class StageClock:
    def __init__(self, now: float, num_workers: int = 0) -> None:
        self._totals = _Totals()
        self._started = now
        self._epoch_from = _Totals()
        self._epoch_started = now
        self.worker_busy = [0.0] * num_workers  # this epoch, per worker
        self.worker_busy_total = [0.0] * num_workers

    def new_epoch(self, now: float) -> None:
        self._epoch_from = dataclasses.replace(self._totals)
        self._epoch_started = now
        self.worker_busy = [0.0] * len(self.worker_busy)

    def add_worker(self) -> None:
        self.worker_busy.append(0.0)
        self.worker_busy_total.append(0.0)

    def mark(self, now: float) -> tuple[_Totals, float]:
        """The totals now, for :meth:`since` (a window of batches: autotune)."""
        return dataclasses.replace(self._totals), now

    def since(self, mark: tuple[_Totals, float], now: float) -> StageTimes:
        return _times(self._totals, mark[0], now - mark[1])

    def worked(
        self,
        worker_id: int,
        busy_s: float,
        fetch_s: float,
        collate_s: float,
        send_s: float,
        nbytes: int = 0,
    ) -> None:
        """A worker answered a task (its own account of its time)."""
        t = self._totals
        t.busy_s += busy_s
        t.fetch_s += fetch_s
        t.collate_s += collate_s
        t.send_s += send_s
        t.bytes += nbytes
        if 0 <= worker_id < len(self.worker_busy):
            self.worker_busy[worker_id] += busy_s
            self.worker_busy_total[worker_id] += busy_s

    def handed_out(
        self, samples: int, decode_s: float = 0.0, pin_s: float = 0.0, wait_s: float = 0.0
    ) -> None:
        """A batch reached the user: rebuilt, pinned, and waited for this long."""
        t = self._totals
        t.batches += 1
        t.samples += samples
        t.decode_s += decode_s
        if pin_s:
            t.pin_s += pin_s
        if wait_s:
            t.wait_s += wait_s

    def delivered(
        self,
        worker_id: int,
        worked: WorkerAccount,
        nbytes: int,
        samples: int,
        decode_s: float,
        pin_s: float,
        wait_s: float,
    ) -> None:
        """A worker's batch reached the user: :meth:`worked` and :meth:`handed_out` in
        one (the loop with workers counts a batch's stages as it hands it out: one call
        a batch)."""
        t = self._totals
        busy_s = worked.busy_s
        t.busy_s += busy_s
        t.fetch_s += worked.fetch_s
        t.collate_s += worked.collate_s
        t.send_s += worked.encode_s
        t.bytes += nbytes
        t.batches += 1
        t.samples += samples
        t.decode_s += decode_s
        if pin_s:
            t.pin_s += pin_s
        if wait_s:
            t.wait_s += wait_s
        self.worker_busy[worker_id] += busy_s  # (a worker's: the loop without has no reply)
        self.worker_busy_total[worker_id] += busy_s

    def waited(self, seconds: float) -> None:
        """The training loop waited this long inside ``next()``."""
        self._totals.wait_s += seconds

    def epoch(self, now: float) -> StageTimes:
        return _times(self._totals, self._epoch_from, now - self._epoch_started)

    def total(self, now: float) -> StageTimes:
        return _times(self._totals, _Totals(), now - self._started)


def _times(totals: _Totals, since: _Totals, seconds: float) -> StageTimes:
    values = {
        f.name: getattr(totals, f.name) - getattr(since, f.name)
        for f in dataclasses.fields(_Totals)
    }
    return StageTimes(seconds=max(0.0, seconds), **values)
