"""The samples an epoch leaves out under ``on_error="skip"``, and its budget."""

from __future__ import annotations

import logging
from typing import Any

from ..config import SupervisionPolicy
from ..records import SkippedSample

log = logging.getLogger("conveyor")


class SkipLedger:
    """Appends to the loader's log (so records outlive iterators) and counts per epoch."""

    def __init__(self, records: list[SkippedSample], policy: SupervisionPolicy) -> None:
        self.records = records
        self._policy = policy
        self.epoch = 0
        self._epoch_start = len(records)
        self._budget: int | None = None
        self._poison = {s.index for s in records if s.stage == "crash"}

    def start_epoch(self, epoch: int, epoch_samples: int | None) -> None:
        self.epoch = epoch
        self._epoch_start = len(self.records)
        self._budget = self._policy.error_budget(epoch_samples)

    def record(
        self, index: Any, worker_id: int | None, stage: str, exception_type: str, message: str
    ) -> None:
        self.records.append(
            SkippedSample(index, self.epoch, worker_id, stage, exception_type, message)
        )

    def mark_poison(self, indices: tuple[Any, ...]) -> None:
        """Samples found to kill workers: left out of every later task, at once."""
        self._poison.update(indices)

    @property
    def lost_this_epoch(self) -> int:
        return len(self.records) - self._epoch_start

    def over_budget(self) -> bool:
        return self._budget is not None and self.lost_this_epoch > self._budget

    def budget_note(self) -> str:
        return (
            f"on_error='skip' gave up: {self.lost_this_epoch} samples skipped in epoch "
            f"{self.epoch}, more than max_errors={self._policy.max_errors!r} allows "
            f"({self._budget} samples). The skipped samples are in loader.skipped_samples. "
            "Fix the dataset, or raise max_errors if losing them is acceptable."
        )

    def poison(self) -> set[Any]:
        """Samples that killed their worker: left out up front in later tasks."""
        return self._poison  # kept as records arrive: this is asked once per task

    def log_epoch_summary(self) -> None:
        skipped = self.records[self._epoch_start :]
        if not skipped:
            return
        shown = ", ".join(
            f"{s.index!r} ({s.exception_type.rsplit('.', 1)[-1]})" for s in skipped[:10]
        )
        log.warning(
            "Epoch %d: skipped %d sample(s) under on_error='skip': %s%s. "
            "All are in loader.skipped_samples.",
            self.epoch,
            len(skipped),
            shown,
            ", ..." if len(skipped) > 10 else "",
        )


def type_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"
