"""``progress=True``: samples/s, the loop's data-wait share, restarts and skips as an
epoch goes, in tqdm's bar when tqdm is installed, else as a plain line every
:data:`EVERY_S` seconds (for batch jobs whose output is a file)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import time
from typing import Any

from ..records import LoaderStatistics

__all__ = ["EVERY_S", "ProgressLine", "line"]

EVERY_S = 10.0  # the plain line's period
_POSTFIX_S = 0.5  # tqdm's figures are refreshed at most this often (they cost a little)
logger = logging.getLogger("conveyor")


def line(stats: LoaderStatistics, total: int | None) -> str:
    """``epoch 3: 1,200/5,000 batches, 12,345 samples/s, loop waiting 3%, 0 restarts, ...``"""
    stages = stats.stages
    done = f"{stages.batches:,}" + (f"/{total:,}" if total else "")
    return (
        f"epoch {stats.epoch}: {done} batches, {stages.samples_per_s:,.0f} samples/s, "
        f"loop waiting {stages.wait_share:.0%}, {stats.worker_restarts} restarts, "
        f"{stats.samples_skipped} skipped"
    )


class ProgressLine:
    """One epoch's progress; :meth:`batch` after every batch, :meth:`close` at its end."""

    def __init__(self, total: int | None, *, use_tqdm: bool | None = None) -> None:
        self.total = total
        if use_tqdm is None:
            use_tqdm = importlib.util.find_spec("tqdm") is not None
        self._bar: Any = None
        if use_tqdm:
            tqdm = importlib.import_module("tqdm.auto").tqdm
            self._bar = tqdm(total=total, unit="batch", desc="conveyor", leave=False)
        self._next = time.monotonic() + (_POSTFIX_S if self._bar is not None else EVERY_S)

    def batch(self, stats: Any) -> None:
        """A batch was handed out; ``stats()`` gives the statistics when they are shown."""
        if self._bar is not None:
            self._bar.update(1)
        now = time.monotonic()
        if now < self._next:
            return
        snapshot: LoaderStatistics = stats()
        if self._bar is not None:
            self._next = now + _POSTFIX_S
            stages = snapshot.stages
            self._bar.set_postfix(
                samples_per_s=f"{stages.samples_per_s:,.0f}",
                waiting=f"{stages.wait_share:.0%}",
                restarts=snapshot.worker_restarts,
                skipped=snapshot.samples_skipped,
                refresh=False,
            )
        else:
            self._next = now + EVERY_S
            say(line(snapshot, self.total))

    def close(self, final: LoaderStatistics | None = None) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif final is not None:
            say(line(final, self.total))


def say(text: str) -> None:
    """On the ``conveyor`` logger at INFO where logging is set up to show it; else on
    stderr (asked for, so it must be seen)."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(text)
    else:
        print(f"conveyor: {text}", file=sys.stderr, flush=True)
