"""How many function calls the main process makes per batch: a count, not a time.

Time per batch moves with the machine's load; the calls a loader makes to hand out a
batch do not (only which way a batch came: already read, or waited for). ``count_calls``
runs ``batches`` more batches of an iterator under ``sys.setprofile`` and returns the
Python calls and the C calls per batch, with the functions called most, so a rise
names its culprit. The profile hook makes those batches several times slower: they are
counted after a timed window, never inside one.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any


@dataclass(frozen=True)
class CallCount:
    """Calls the main thread made per batch: Python functions, C functions."""

    python: float
    c: float
    batches: int
    top: tuple[tuple[str, float], ...] = ()  # the most called, per batch

    @property
    def total(self) -> float:
        return self.python + self.c

    def report(self, count: int = 25) -> str:
        lines = [f"{self.python:.1f} Python + {self.c:.1f} C calls per batch ({self.batches})"]
        lines += [f"  {per_batch:6.2f}  {name}" for name, per_batch in self.top[:count]]
        return "\n".join(lines)


def _name(frame: FrameType, event: str, arg: Any) -> str:
    if event == "c_call":
        return f"[C] {getattr(arg, '__qualname__', None) or getattr(arg, '__name__', repr(arg))}"
    code = frame.f_code
    path = code.co_filename
    short = path.rsplit("/src/", 1)[-1] if "/src/" in path else path.rsplit("/", 1)[-1]
    return f"{short}:{code.co_name}"


def count_calls(
    take: Callable[[], Any],
    batches: int,
    *,
    keep: int = 40,
    between: Callable[[], None] | None = None,
) -> CallCount:
    """Call ``take`` (one batch) ``batches`` times under a profile hook of this thread;
    ``between`` runs between batches, not counted (a consumer's own work). Each batch
    is dropped as the next one comes, as a training loop drops it: what its memory
    going back costs (the loader's own callbacks) is counted."""
    python: collections.Counter[str] = collections.Counter()
    c: collections.Counter[str] = collections.Counter()
    counting = [True]

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if not counting[0]:
            return
        if event == "call":
            python[_name(frame, event, arg)] += 1
        elif event == "c_call":
            c[_name(frame, event, arg)] += 1

    previous = sys.getprofile()
    batch: Any = None
    taken = 0
    sys.setprofile(hook)
    try:
        for _ in range(batches):
            counting[0] = True
            try:
                batch = take()  # (the last one is dropped here)
            except StopIteration:  # the epoch ended first: what was counted stands
                break
            taken += 1
            counting[0] = False
            if between is not None:
                between()
        counting[0] = True
        del batch
    finally:
        sys.setprofile(previous)
    c.pop("[C] setprofile", None)  # the hook's own switching off
    n = max(1, taken)
    top = sorted(((name, k / n) for name, k in (python + c).items()), key=lambda p: -p[1])
    return CallCount(sum(python.values()) / n, sum(c.values()) / n, taken, tuple(top[:keep]))


def count_iterator(it: Iterator[Any], batches: int, keep: int = 40) -> CallCount:
    """:func:`count_calls` over ``batches`` of ``it`` (the consumer touches nothing)."""
    return count_calls(lambda: next(it), batches, keep=keep)
