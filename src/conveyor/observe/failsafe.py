"""Instruments never hurt training (DESIGN.md, invariant 10).

The progress display, the epoch's report, the trace and the verdict are extras: a
broken or closed stderr, a path that cannot be written, a bug of theirs or of tqdm's
must never end or slow a training run. Each guards its own work with :func:`guarded`:
the first failure is logged on the ``conveyor`` logger, once, and that instrument stays
off in this process (what broke it, a stderr whose reader is gone, is the process's).
Logging itself never raises: with stderr gone, the record is dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["failed", "guarded", "is_off"]

logger = logging.getLogger("conveyor")
_T = TypeVar("_T")
_off: set[str] = set()  # instruments that failed in this process
_lock = threading.Lock()


def is_off(instrument: str) -> bool:
    """Whether ``instrument`` failed earlier in this process (and stays off)."""
    return instrument in _off


def failed(instrument: str, error: BaseException) -> None:
    """``instrument`` failed with ``error``: log it the first time, and turn it off."""
    with _lock:
        first = instrument not in _off
        _off.add(instrument)
    if first:  # (the words only: a record holding the error would keep its frames alive)
        logger.warning(
            f"conveyor: the {instrument} failed ({type(error).__name__}: {error}) and is "
            "off from now on in this process; training goes on without it."
        )


def guarded(instrument: str, work: Callable[[], _T]) -> _T | None:
    """``work()``, or None when ``instrument`` is off or ``work`` raises (then logged once
    and turned off). Ctrl-C and the like (BaseException) pass through."""
    if instrument in _off:
        return None
    try:
        return work()
    except Exception as error:
        failed(instrument, error)
        return None
