"""What the Ctrl-C tests look at: where a signal landed, and what descriptors are open.

Used by tests in this process and by the child programs in ``tests/faults/scripts``
(started with :data:`CHILD_ENV`, which puts the repository root on their path).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import FrameType

from conveyor._workers import pool as pool_module

ROOT = Path(__file__).resolve().parents[2]
CHILD_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}


def in_pool_teardown(frame: FrameType | None) -> bool:
    """Whether Python was running the worker pool's teardown where a signal arrived."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_teardown" and code.co_filename == pool_module.__file__:
            return True
        frame = frame.f_back
    return False


def open_fds() -> dict[int, str]:
    """Every descriptor this process holds, and what it points to (pipes and sockets
    included)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir used
            continue
    return found
