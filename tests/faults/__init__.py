"""Fault tests: user errors, crashes, hangs and teardown, under every start method."""

from __future__ import annotations

from typing import Any

START_METHODS = ("fork", "spawn", "forkserver")
CHEAP_METHODS = ("fork", "forkserver")


def matrix(rows: list[tuple[Any, ...]], spawn: int = 1) -> list[tuple[Any, ...]]:
    """``(start_method, *row)`` for each row under fork and forkserver, and the first
    ``spawn`` rows under spawn as well.

    A spawn worker spends 1-3 s importing torch: variants whose code path does not
    depend on the start method run under the two cheap ones only.
    """
    cases = [(method, *row) for row in rows for method in CHEAP_METHODS]
    cases += [("spawn", *row) for row in rows[:spawn]]
    return cases
