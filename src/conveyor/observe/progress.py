"""``progress=True``: samples/s, the loop's data-wait share, restarts and skips as an
epoch goes, in tqdm's bar when tqdm is installed, else as a plain line every
:data:`EVERY_S` seconds (for batch jobs whose output is a file)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import sys
import time
from typing import Any

from ..records import LoaderStatistics
from . import failsafe

__all__ = ["EVERY_S", "ProgressLine", "line"]

EVERY_S = 10.0  # the plain line's period
DISPLAY = "progress display"  # its name for failsafe.py
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
        """A display that fails (stderr closed, or its reader gone; tqdm's own error) is
        logged once and stays off: it never breaks training (see failsafe.py)."""
        self.total = total
        if use_tqdm is None:
            use_tqdm = importlib.util.find_spec("tqdm") is not None
        self._bar: Any = None
        if use_tqdm:
            self._bar = failsafe.guarded(DISPLAY, lambda: _new_bar(total))
        self._next = time.monotonic() + (_POSTFIX_S if self._bar is not None else EVERY_S)

    def batch(self, stats: Any) -> None:
        """A batch was handed out; ``stats()`` gives the statistics when they are shown."""
        if failsafe.guarded(DISPLAY, lambda: self._batch(stats)) is None:
            self._drop_bar()

    def _batch(self, stats: Any) -> bool:
        if self._bar is not None:
            self._bar.update(1)
        now = time.monotonic()
        if now < self._next:
            return True
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
        return True

    def close(self, final: LoaderStatistics | None = None) -> None:
        if failsafe.guarded(DISPLAY, lambda: self._close(final)) is None:
            self._drop_bar()

    def _close(self, final: LoaderStatistics | None) -> bool:
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()
        elif final is not None:
            say(line(final, self.total))
        return True

    def _drop_bar(self) -> None:
        """The display failed (or is off): forget the bar, which must not try again when
        it is garbage (tqdm's close writes)."""
        bar, self._bar = self._bar, None
        if bar is not None:
            with contextlib.suppress(Exception):
                bar.disable = True


def _new_bar(total: int | None) -> Any:
    tqdm = importlib.import_module("tqdm.auto").tqdm
    return tqdm(total=total, unit="batch", desc="conveyor", leave=False, file=_stderr())


class _ByDescriptor:
    """The interpreter's own stderr, written through its descriptor, so a write that
    fails (its reader gone) leaves nothing in ``sys.stderr``'s buffer to fail again at
    the next flush (multiprocessing flushes it at every fork)."""

    def __init__(self, stream: io.TextIOWrapper) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.flush()  # what is written already goes first
        data = text.encode(self._stream.encoding or "utf-8", "replace")
        while data:
            data = data[os.write(self._stream.fileno(), data) :]
        return len(text)

    def flush(self) -> None:
        pass  # every write went out whole


def _stderr() -> Any:
    """Where the display writes: stderr, through its descriptor where it is the
    interpreter's own (a terminal, a pipe, a file), else as it is (a notebook's stream,
    which tqdm draws a widget for; a capture). Raises OSError when stderr is closed (the
    callers are guarded: failsafe.py)."""
    stream = sys.stderr
    if stream is None:  # started with stderr closed: nowhere to show it
        raise OSError("stderr is closed")
    if type(stream) is io.TextIOWrapper:
        return _ByDescriptor(stream)
    return stream


def say(text: str) -> None:
    """On the ``conveyor`` logger at INFO where logging is set up to show it; else on
    stderr (asked for, so it must be seen). Raises OSError when stderr is closed or its
    reader gone (the callers are guarded: failsafe.py)."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(text)
        return
    stream = _stderr()
    stream.write(f"conveyor: {text}\n")
    stream.flush()
