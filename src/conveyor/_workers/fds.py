"""File descriptors handed to a worker under every start method."""

from __future__ import annotations

import os
from multiprocessing import context, reduction
from typing import Any


class InheritedFd:
    """A file descriptor the worker receives from the main process.

    Under ``fork`` the child simply inherits the number. Under ``spawn`` and
    ``forkserver`` the Process object is pickled, and ``DupFd`` arranges (the
    same way multiprocessing passes its own pipes) for the descriptor to be
    duplicated into the child.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        if context.get_spawning_popen() is None:
            raise TypeError("InheritedFd can only be pickled while starting a process")
        return (_from_dup, (reduction.DupFd(self.fd),))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _from_dup(dup: Any) -> InheritedFd:
    return InheritedFd(dup.detach())
