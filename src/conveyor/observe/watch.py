"""What the user asked to see as an epoch goes: the progress line (``progress=True``) and,
at its end, the epoch's figures with the verdict (``report=True``, or the environment
variable ``CONVEYOR_REPORT=1``), on the ``conveyor`` logger."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..config import LoaderConfig
from ..records import LoaderStatistics
from . import failsafe
from .progress import ProgressLine, line, say
from .verdict import diagnose

__all__ = ["REPORT_ENV", "Watch"]

REPORT_ENV = "CONVEYOR_REPORT"


class Watch:
    def __init__(self, progress: bool, report: bool, total: int | None) -> None:
        self._line = ProgressLine(total) if progress else None
        self._report = report
        self._total = total

    @staticmethod
    def of(config: LoaderConfig) -> Watch | None:
        """The epoch's watch, or None when nothing was asked for (the common case: the
        loops then do nothing more per batch)."""
        report = config.options.report or os.environ.get(REPORT_ENV, "") not in ("", "0")
        if not (config.options.progress or report):
            return None
        try:
            total: int | None = len(config.index_sampler)
        except TypeError:
            total = None
        return Watch(config.options.progress, report, total)

    def batch(self, statistics: Callable[[], LoaderStatistics]) -> None:
        if self._line is not None:
            self._line.batch(statistics)

    def ended(self, stats: LoaderStatistics) -> None:
        if self._line is not None:
            self._line.close(None if self._report else stats)
        if self._report:
            failsafe.guarded("epoch report", lambda: self._report_epoch(stats))

    def _report_epoch(self, stats: LoaderStatistics) -> bool:
        from ..diagnostics.environment import cpus

        say(f"{line(stats, self._total)}. {diagnose(stats, cpus().usable)}")
        return True
