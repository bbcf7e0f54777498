"""A memory cgroup of our own for a child program, where the machine allows one.

cgroup v2 (``memory.max``) or v1 (``memory.limit_in_bytes``): a child group is made
under this process's own memory cgroup, limited, and removed afterwards. A child
program joins it with :meth:`MemoryCgroup.command` (a shell that moves itself in and
then execs the program, so nothing the program allocates is charged elsewhere).
:func:`memory_cgroup` says why not (``pytest.skip`` material) when it cannot be made.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conveyor_bench.charged import own_cgroup

__all__ = ["MemoryCgroup", "memory_cgroup"]


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    version: int  # 1 or 2

    def command(self, argv: list[str]) -> list[str]:
        """``argv``, run inside this group."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *argv]

    def peak_bytes(self) -> int | None:
        """The most memory the group used (v1 always; v2 where the kernel has memory.peak)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int | None:
        """Processes the OOM killer killed in the group (None: the kernel does not say)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            lines = (self.path / name).read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None


def _make(limit: int) -> tuple[MemoryCgroup | None, str]:
    reasons = []
    for version, limit_file in ((2, "memory.max"), (1, "memory.limit_in_bytes")):
        parent = own_cgroup(version)
        if parent is None or not parent.is_dir():
            reasons.append(f"no cgroup v{version} memory hierarchy")
            continue
        if version == 2 and "memory" not in _read(parent / "cgroup.subtree_control"):
            reasons.append("cgroup v2 without the memory controller for child groups")
            continue
        child = parent / f"conveyor-test-{os.getpid()}-{time.monotonic_ns()}"
        try:
            child.mkdir()
        except OSError as exc:
            reasons.append(f"cannot make a v{version} cgroup under {parent}: {exc.strerror}")
            continue
        try:
            (child / limit_file).write_text(str(limit))
        except OSError as exc:
            child.rmdir()
            reasons.append(f"cannot set {limit_file}: {exc.strerror}")
            continue
        return MemoryCgroup(child, version), ""
    return None, "; ".join(reasons)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[tuple[MemoryCgroup | None, str]]:
    """A child cgroup limited to ``limit`` bytes, or ``(None, why not)``. Removed at the
    end, once the processes in it are gone (up to 10 s)."""
    group, why = _make(limit)
    try:
        yield group, why
    finally:
        if group is not None:
            deadline = time.monotonic() + 10
            while True:
                try:
                    group.path.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)  # its last processes are still exiting
