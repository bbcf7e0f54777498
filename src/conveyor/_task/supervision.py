"""What the loader does when workers die, hang or meet a bad sample: its failure options."""

from __future__ import annotations

import math
from dataclasses import dataclass

from conveyor.errors import ConfigError

__all__ = ["ON_ERROR", "ON_TIMEOUT", "SupervisionPolicy", "is_number"]

ON_ERROR = ("raise", "skip")
ON_TIMEOUT = ("raise", "restart")


@dataclass(frozen=True)
class SupervisionPolicy:
    """The keyword-only failure options of ``DataLoader``.

    * ``max_worker_restarts``: dead workers replaced (and their tasks re-sent)
      over the iterator's life before giving up with ``WorkerCrashedError``
      (deaths a sample is proven to cause are not counted).
    * ``on_error``: ``"raise"`` (torch's behaviour) or ``"skip"`` a sample whose
      fetch raises, a batch whose collate raises, and a sample proven to kill its
      worker (it kills a fresh worker alone too). Skipped samples are recorded,
      never silently lost.
    * ``max_errors``: with ``"skip"``, how many samples an epoch may lose — a
      count (int) or a fraction of the epoch (float < 1) — before raising anyway.
    * ``stall_warning``: seconds after which a task still running is reported
      with the worker's Python stack (None: never). The threshold grows to ten
      times the workers' typical time per batch, so slow-but-steady datasets
      are not flagged.
    * ``on_timeout``: when ``timeout`` expires, ``"raise"`` (torch) or
      ``"restart"``: replace the stuck worker (a process is killed, a thread abandoned)
      and retry its tasks.
    """

    max_worker_restarts: int = 3
    on_error: str = "raise"
    max_errors: int | float = 0.01
    stall_warning: float | None = 60.0
    on_timeout: str = "raise"

    def __post_init__(self) -> None:
        restarts = self.max_worker_restarts
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ConfigError(
                f"max_worker_restarts must be an int >= 0, got {self.max_worker_restarts!r}"
            )
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.on_timeout not in ON_TIMEOUT:
            raise ConfigError(f"on_timeout must be one of {ON_TIMEOUT}, got {self.on_timeout!r}")
        budget = self.max_errors
        if not is_number(budget) or not budget >= 0:  # "not >=" also rejects NaN
            raise ConfigError(
                "max_errors must be a count (int >= 0) or a fraction of the epoch "
                f"(0 <= float < 1), got {budget!r}"
            )
        if isinstance(budget, float) and budget >= 1:
            raise ConfigError(
                f"max_errors as a float is a fraction of the epoch and must be < 1, got {budget!r}"
                f" (for a count, pass an int: max_errors={int(budget)})"
            )
        stall = self.stall_warning
        if stall is not None and not (is_number(stall) and stall > 0 and math.isfinite(stall)):
            raise ConfigError(
                f"stall_warning must be > 0 seconds or None, got {self.stall_warning!r}"
            )

    @property
    def skipping(self) -> bool:
        return self.on_error == "skip"

    def error_budget(self, epoch_samples: int | None) -> int | None:
        """Samples an epoch may skip; None when a fraction has no epoch size to apply to."""
        if isinstance(self.max_errors, int):
            return self.max_errors
        if epoch_samples is None:
            return None
        return math.ceil(self.max_errors * epoch_samples)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
