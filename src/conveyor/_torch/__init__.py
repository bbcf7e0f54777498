"""Where conveyor gets torch from.

In the main process torch is imported as soon as conveyor is (if installed).
A spawn or forkserver worker starts with torch *deferred*: importing torch
costs about a second and a few hundred MB per process, and a worker only needs
it when the user's own objects use it (then it is already imported) or when a
batch needs torch's exact collate semantics (then ``require()`` imports it).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

DEFER_ENV = "CONVEYOR_WORKER_DEFERS_TORCH"


def deferred() -> bool:
    """True in a worker that has not needed torch yet."""
    return os.environ.get(DEFER_ENV) == "1" and "torch" not in sys.modules


def load() -> Any:
    """torch, or None when it is not installed or (in a worker) not needed yet."""
    if deferred():
        return None
    return require()


_missing = False


def require() -> Any:
    """torch, imported now if need be; None only when it is not installed."""
    global _missing
    if _missing:
        return None
    try:
        import torch
    except ImportError:
        _missing = True
        return None
    return torch


def on_import(callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(torch)`` now if torch is imported, else right after it is."""
    torch = sys.modules.get("torch")
    if torch is not None:
        callback(torch)
    else:
        sys.meta_path.insert(0, _AfterImport("torch", callback))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of one module to add a callback."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module
        callback = self._callback

        def exec_module(module: ModuleType) -> None:
            run(module)
            callback(module)

        loader.exec_module = exec_module
        return spec
