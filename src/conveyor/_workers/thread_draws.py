"""``random``'s and NumPy's module functions, answered per thread worker.

``random.random()``, ``random.randint()``, ``np.random.rand()``, ``np.random.seed()`` and
their kin draw from (or seed) one generator per process. Thread workers, and the threads
of a ``threads_per_worker`` process, would share it, in whatever order they happen to
run: augmentations would change from run to run. So once a thread worker starts, those
module attributes become routers: called in a thread worker, they draw from that
worker's own stand-ins (``WorkerScope.module_draws``, seeded as a process worker's
module generators are, so threads and processes draw alike); called anywhere else (the
training loop, a process worker, any other thread), from the process's generator exactly
as before, with the same values.

What cannot be routed: a function bound before the first thread worker started
(``from random import random`` at import time keeps the shared one), code that holds the
generator itself (``np.random.mtrand._rand``), and torch's global generator, which torch's
own functions reach in C++: the thread pre-flight names what draws from it
(diagnostics/torch_draws.py).
"""

from __future__ import annotations

import functools
import importlib
import random
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor._workers import scope as _scope

__all__ = ["route_module_draws"]

# NumPy's module functions that are not bound methods of its global RandomState but act
# on it: the RandomState method each stands for.
_NUMPY_FUNCTIONS = {"seed": "seed", "ranf": "random_sample", "sample": "random_sample"}
_lock = threading.Lock()
_routed = False


def route_module_draws() -> None:
    """Route ``random``'s and ``numpy.random``'s module functions through the current
    thread worker, once per process (later calls return at once)."""
    global _routed
    if _routed:
        return
    with _lock:
        if _routed:
            return
        shared_random = getattr(random, "_inst", None)
        for name, value in list(vars(random).items()):
            if shared_random is not None and getattr(value, "__self__", None) is shared_random:
                _route(random, name, value, lambda draws: draws.random)
        shared_numpy = getattr(np.random.mtrand, "_rand", None)
        for name, value in list(vars(np.random).items()):
            own_name = _NUMPY_FUNCTIONS.get(name, name)
            bound = shared_numpy is not None and getattr(value, "__self__", None) is shared_numpy
            if bound or (name in _NUMPY_FUNCTIONS and callable(value)):
                _route(np.random, name, value, lambda draws: draws.numpy, own_name)
        _routed = True


def _route(
    module: Any, name: str, shared: Any, generator: Callable[[Any], Any], own: str = ""
) -> None:
    if isinstance(shared, _Router):
        return
    setattr(module, name, _Router(module.__name__, name, shared, generator, own or name))


class _Router:
    """One module function: the thread worker's own stand-in, or the shared generator."""

    def __init__(
        self, module: str, name: str, shared: Any, generator: Callable[[Any], Any], own: str
    ) -> None:
        self._shared = shared
        self._generator = generator
        self._own = own
        self._where = (module, name)
        functools.update_wrapper(self, shared)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        scope = _scope.current()
        draws = scope.module_draws if scope is not None else None
        if draws is None:
            return self._shared(*args, **kwargs)
        return getattr(self._generator(draws), self._own)(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_module_function, self._where)  # what the module holds where it is loaded

    def __repr__(self) -> str:
        return f"<{self._where[0]}.{self._where[1]}, per thread worker (conveyor)>"


def _module_function(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)
