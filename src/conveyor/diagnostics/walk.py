"""A bounded walk through what the workers will hold.

:class:`Walk` goes breadth-first through the dataset, ``collate_fn`` and
``worker_init_fn`` along :func:`~.paths.held_parts` — attributes, slots,
container items, closures, defaults, bound methods, ``functools.partial`` —
naming each part in the one path grammar of :mod:`.paths`, and keeps what the
checks need: open handles, huge Python containers, tensors, random generators,
objects known to draw from torch's global generator (:mod:`.torch_draws`) and ints
held under a file descriptor's name (``.fd``, ``['fileno']``). It is bounded
(depth, items sampled per container, objects in all), guards cycles, never
raises, and reads attributes without calling ``__getattr__`` or properties.
NumPy arrays and tensors are leaves: they are not hazards. A function's globals
are followed only when cloudpickle would send the function by value
(``__main__``, local functions, lambdas), never into modules.

``pickled=True`` follows only what a spawn or forkserver worker receives: an
object with its own ``__reduce__``/``__getstate__`` has taken charge of its
pickled form and is not looked into. Under fork the child gets the memory as
is, and everything is followed.
"""

from __future__ import annotations

import collections
import copyreg
import functools
import random
import sys
import types
from collections.abc import Sequence
from typing import Any

from .handles import descriptor_name, handle_kind
from .paths import held_parts
from .torch_draws import torch_draw_of

__all__ = ["LARGE_CONTAINER", "MAX_DEPTH", "MAX_ITEMS", "MAX_OBJECTS", "Walk", "within"]

MAX_DEPTH = 6
MAX_ITEMS = 100  # items looked at per container (the first ones)
MAX_OBJECTS = 2_000  # objects examined per walk, whatever the dataset
LARGE_CONTAINER = 100_000  # Python objects in one container worth a warning

_ATOMS = (
    type(None), bool, int, float, complex, str, bytes, bytearray, memoryview, range, slice,
    type, types.ModuleType, types.CodeType, type(Ellipsis),
)  # fmt: skip
# Modules whose objects are ours or meant to cross a fork (loggers, queues): not looked into.
_OPAQUE_MODULES = ("conveyor", "logging", "multiprocessing", "threading", "_thread")
_ATOM, _ARRAY, _TENSOR, _HANDLE, _RNG, _OPAQUE, _CONTAINER, _COMPOUND = range(8)
_NUMPY_RNGS = ("Generator", "RandomState", "BitGenerator")

Child = tuple[str, Any]  # (path, object)


class Walk:
    """What ``roots`` (``[("dataset", ds), ...]``) hold, found in one bounded walk.

    ``handles``, ``containers`` (more than :data:`LARGE_CONTAINER` items),
    ``tensors``, ``rngs`` (NumPy's and ``random.Random`` generators),
    ``torch_draws`` (objects that draw from torch's global generator: ``(path, object,
    what it is)``) and ``descriptors`` (ints above 2 whose name says file descriptor)
    list ``(path, object)`` pairs in the order met: shallowest first.
    """

    def __init__(
        self, roots: Sequence[Child], *, pickled: bool = False, max_objects: int = MAX_OBJECTS
    ) -> None:
        self.pickled = pickled
        self.examined = 0  # objects looked at, scalars included
        self.truncated = False  # stopped at max_objects
        self.handles: list[Child] = []
        self.containers: list[Child] = []
        self.tensors: list[Child] = []
        self.rngs: list[Child] = []
        self.torch_draws: list[tuple[str, Any, str]] = []
        self.descriptors: list[Child] = []
        self._kinds: dict[type, int] = {}
        self._draws: dict[type, str | None] = {}
        seen: dict[int, Any] = {}  # id -> object, kept alive so ids stay unique
        queue: collections.deque[tuple[str, Any, int]] = collections.deque()
        for name, obj in roots:
            if obj is not None and id(obj) not in seen:
                seen[id(obj)] = obj
                queue.append((name, obj, 0))
        while queue and not self.truncated:
            path, obj, depth = queue.popleft()
            try:
                if self._visit(path, obj) < _CONTAINER or depth >= MAX_DEPTH:
                    continue
                for group in held_parts(obj, MAX_ITEMS):
                    for i, child in enumerate(group.values):
                        self.examined += 1
                        if self.examined >= max_objects:
                            self.truncated = True
                            break
                        if type(child) is int:
                            if child > 2 and descriptor_name(suffix := group.suffix(i)):
                                self.descriptors.append((path + suffix, child))
                            continue
                        if type(child) in _ATOMS or id(child) in seen:
                            continue
                        seen[id(child)] = child
                        queue.append((path + group.suffix(i), child, depth + 1))
                    if self.truncated:
                        break
            except Exception:  # a hostile object: skip what is left of it
                continue

    def _visit(self, path: str, obj: Any) -> int:
        kind = self._kinds.get(type(obj))
        if kind is None:
            kind = self._kinds[type(obj)] = _classify(type(obj), self.pickled)
        if kind == _HANDLE:
            self.handles.append((path, obj))
        elif kind == _TENSOR:
            self.tensors.append((path, obj))
        elif kind == _RNG:
            self.rngs.append((path, obj))
        elif kind == _ARRAY:
            if obj.dtype.kind == "O" and obj.size > LARGE_CONTAINER:
                self.containers.append((path, obj))
        elif kind == _CONTAINER and len(obj) > LARGE_CONTAINER:
            self.containers.append((path, obj))
        elif kind in (_COMPOUND, _OPAQUE):  # (opaque: pickles itself, under spawn)
            if type(obj) not in self._draws:
                self._draws[type(obj)] = torch_draw_of(type(obj))
            what = self._draws[type(obj)]
            if what is not None:
                self.torch_draws.append((path, obj, what))
        return kind


def _classify(kind: type, pickled: bool) -> int:
    if issubclass(kind, _ATOMS):
        return _ATOM
    module = getattr(kind, "__module__", "") or ""
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if numpy is not None and issubclass(kind, (numpy.ndarray, numpy.generic, numpy.dtype)):
        return _ARRAY if issubclass(kind, numpy.ndarray) else _ATOM
    if torch is not None and issubclass(kind, torch.Tensor):
        return _TENSOR
    if handle_kind(kind) is not None:
        return _HANDLE
    if issubclass(kind, _rng_classes()) and not issubclass(kind, random.SystemRandom):
        return _RNG
    if within(module, _OPAQUE_MODULES):
        return _OPAQUE
    if issubclass(kind, (dict, list, tuple, set, frozenset, collections.deque)):
        return _CONTAINER
    if issubclass(kind, (types.FunctionType, types.MethodType, functools.partial)):
        return _COMPOUND
    if issubclass(kind, types.BuiltinMethodType):
        return _COMPOUND  # a bound C method (conn.execute): its __self__ travels
    if pickled and _pickles_itself(kind):
        return _OPAQUE
    return _COMPOUND


def _rng_classes() -> tuple[type, ...]:
    """Generators that carry their state into a worker (``SystemRandom`` has none)."""
    numpy_random = sys.modules.get("numpy.random")  # never imported here: only if the program did
    found = [getattr(numpy_random, name, None) for name in _NUMPY_RNGS] if numpy_random else []
    return tuple(c for c in (*found, random.Random) if isinstance(c, type))


def within(module: str, packages: Sequence[str]) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def _pickles_itself(kind: type) -> bool:
    """Whether ``kind`` decides its own pickled form (then its attributes may not travel)."""
    own_getstate = getattr(kind, "__getstate__", None) not in (
        None,
        getattr(object, "__getstate__", None),
    )
    return (
        own_getstate
        or getattr(kind, "__reduce_ex__", None) is not object.__reduce_ex__
        or getattr(kind, "__reduce__", None) is not object.__reduce__
        or kind in copyreg.dispatch_table
    )
