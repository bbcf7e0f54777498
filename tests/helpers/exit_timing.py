"""How long conveyor's part of an interpreter's exit takes, measured inside the child.

Timed from outside, an exit includes the interpreter's own teardown (torch's modules
and all), which on a loaded two-core machine took from under a second to over ten:
a bound on that is a bound on the machine's load. conveyor's part is its ``atexit``
work (stopping thread workers and waiting for them; closing iterators still alive),
and ``atexit`` runs hooks last registered first, so a child script brackets it::

    from tests.helpers import exit_timing
    exit_timing.outer()  # before conveyor is imported: runs after conveyor's hooks
    from conveyor import DataLoader
    loader = ...; it = iter(loader)
    exit_timing.inner()  # once its loaders exist: runs before conveyor's hooks

and at its exit writes ``conveyor's exit: SECONDS s`` on stderr, which
:func:`seconds` reads back. Nothing here imports conveyor.
"""

from __future__ import annotations

import atexit
import re
import sys
import time

__all__ = ["inner", "outer", "seconds"]

_began: list[float] = []
_LINE = "conveyor's exit: {:.3f} s\n"


def outer() -> None:
    """Call before conveyor is imported: its hook ends the measure."""
    atexit.register(_report)


def inner() -> None:
    """Call once the script's loaders exist: its hook starts the measure."""
    atexit.register(lambda: _began.append(time.monotonic()))


def _report() -> None:
    if _began:
        sys.stderr.write(_LINE.format(time.monotonic() - _began[0]))
        sys.stderr.flush()


def seconds(stderr: str) -> float:
    """The measure a child wrote on ``stderr`` (a failed assertion if none)."""
    found = re.findall(r"conveyor's exit: ([0-9.]+) s", stderr)
    assert found, f"the child wrote no exit timing:\n{stderr}"
    return float(found[-1])
