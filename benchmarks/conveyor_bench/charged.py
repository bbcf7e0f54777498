"""The memory the kernel charged to a loader at its peak: this process moved into a memory
cgroup of its own for the run, its workers (forked or spawned from it) with it.

PSS counts the pages a process has mapped. A batch in shared memory that no process maps
at the moment is in nobody's PSS: torch's finished batches wait in its queue that way (a
descriptor in flight, the worker's map gone, the main process's not made yet), so the
tree's PSS misses most of torch's prefetched batches, while conveyor's, mapped by their
workers all along, are counted. The cgroup is charged for every page its processes
allocate, mapped or not: the same yardstick for both. Where no child cgroup can be made
(no permission, no memory controller) :func:`charged_peak` yields None and the row says
PSS alone.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ChargedPeak", "charged_peak"]

_ROOT = Path("/sys/fs/cgroup")


class ChargedPeak:
    """A child memory cgroup this process runs in; :meth:`added` is its peak charge over
    what it was charged when the run began."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version
        self._base = 0

    def begin(self) -> None:
        """From now on (what was charged before, this process's start-up, is left out)."""
        if self.version == 1:
            (self.path / "memory.max_usage_in_bytes").write_text("0")
            self._base = int((self.path / "memory.usage_in_bytes").read_text())
        else:
            self._base = int((self.path / "memory.current").read_text())

    def added(self) -> int | None:
        """The most the group was charged since :meth:`begin`, less what it was then."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text()) - self._base
        except (OSError, ValueError):
            return None


def own_cgroup(version: int) -> Path | None:
    """This process's memory cgroup directory, for cgroup ``version`` (also the fault
    tests' helper's, tests/helpers/cgroup.py)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if version == 2 and controllers == "":
            return _ROOT / path.lstrip("/")
        if version == 1 and "memory" in controllers.split(","):
            return _ROOT / "memory" / path.lstrip("/")
    return None


def _make() -> tuple[Path, Path, int] | None:
    """(the parent group, a new child of it, the version), or None where it cannot be."""
    for version in (2, 1):
        try:
            parent = own_cgroup(version)
        except OSError:
            return None
        if parent is None or not (parent / "cgroup.procs").exists():
            continue
        if version == 2 and "memory" not in _read(parent / "cgroup.subtree_control"):
            continue
        child = parent / f"conveyor-bench-{os.getpid()}-{time.monotonic_ns()}"
        try:
            child.mkdir()
        except OSError:
            continue
        return parent, child, version
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def charged_peak() -> Iterator[ChargedPeak | None]:
    """Run the block with this process in a memory cgroup of its own (None where one
    cannot be made); this process goes back, and the group is removed once the block's
    processes are gone (up to 10 s)."""
    made = _make()
    if made is None:
        yield None
        return
    parent, child, version = made
    try:
        (child / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        child.rmdir()
        yield None
        return
    try:
        yield ChargedPeak(child, version)
    finally:
        with contextlib.suppress(OSError):
            (parent / "cgroup.procs").write_text(str(os.getpid()))
        gc.collect()
        deadline = time.monotonic() + 10
        while True:
            try:
                child.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # a straggler still in it: left for the system to reap
                time.sleep(0.05)
