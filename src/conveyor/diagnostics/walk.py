"""A bounded walk through what the workers will hold.

:class:`Walk` goes breadth-first through the dataset, ``collate_fn`` and
``worker_init_fn`` — attributes, ``__slots__``, container items, closures,
bound methods, ``functools.partial`` — and keeps what the checks need: open
handles, huge Python containers, tensors. It is bounded (depth, items sampled
per container, objects in all), guards cycles, never raises, and reads
attributes without calling ``__getattr__`` or properties. NumPy arrays and
tensors are leaves: they are not hazards. A function's globals are followed
only when cloudpickle would send the function by value (``__main__``, local
functions, lambdas), never into modules.

``pickled=True`` follows only what a spawn or forkserver worker receives: an
object with its own ``__reduce__``/``__getstate__`` has taken charge of its
pickled form and is not looked into. Under fork the child gets the memory as
is, and everything is followed.
"""

from __future__ import annotations

import collections
import copyreg
import functools
import io
import itertools
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .pickling import _global_names, _short_repr

__all__ = [
    "LARGE_CONTAINER",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_OBJECTS",
    "Walk",
    "handle_kind",
    "within",
]

MAX_DEPTH = 6
MAX_ITEMS = 100  # items looked at per container (the first ones)
MAX_OBJECTS = 2_000  # objects examined per walk, whatever the dataset
LARGE_CONTAINER = 100_000  # Python objects in one container worth a warning

_ATOMS = (
    type(None), bool, int, float, complex, str, bytes, bytearray, memoryview, range, slice,
    type, types.ModuleType, types.BuiltinFunctionType, types.CodeType, type(Ellipsis),
)  # fmt: skip
# Modules whose objects are ours or meant to cross a fork (loggers, queues): not looked into.
_OPAQUE_MODULES = ("conveyor", "logging", "multiprocessing", "threading", "_thread")
_NATIVE_HANDLES = (  # (module, classes, kind): looked up only if the program imported the module
    ("sqlite3", ("Connection",), "sqlite"),
    ("socket", ("socket",), "socket"),
    ("lmdb", ("Environment",), "lmdb"),
    ("h5py", ("File", "Group", "Dataset"), "hdf5"),
)
_ATOM, _ARRAY, _TENSOR, _HANDLE, _CURSOR, _OPAQUE, _MAPPING, _SEQUENCE = range(8)
_FUNCTION, _METHOD, _PARTIAL, _OBJECT = range(8, 12)
_NO_SLOTS = frozenset({"__dict__", "__weakref__"})

Child = tuple[str, Any]  # (path suffix, object)


class Walk:
    """What ``roots`` (``[("dataset", ds), ...]``) hold, found in one bounded walk.

    ``handles``, ``containers`` (more than :data:`LARGE_CONTAINER` items) and
    ``tensors`` list ``(path, object)`` pairs in the order met: shallowest first.
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
        self._kinds: dict[type, int] = {}
        self._slots: dict[type, tuple[str, ...]] = {}
        seen: dict[int, Any] = {}  # id -> object, kept alive so ids stay unique
        queue: collections.deque[tuple[str, Any, int]] = collections.deque()
        for name, obj in roots:
            if obj is not None and id(obj) not in seen:
                seen[id(obj)] = obj
                queue.append((name, obj, 0))
        while queue and not self.truncated:
            path, obj, depth = queue.popleft()
            try:
                kind = self._visit(path, obj)
                if depth >= MAX_DEPTH:
                    continue
                for suffix, child in self._children(obj, kind):
                    self.examined += 1
                    if self.examined >= max_objects:
                        self.truncated = True
                        break
                    if type(child) in _ATOMS or id(child) in seen:
                        continue
                    seen[id(child)] = child
                    queue.append((path + suffix, child, depth + 1))
            except Exception:  # a hostile object: skip what is left of it
                continue

    def _kind(self, kind: type) -> int:
        found = self._kinds.get(kind)
        if found is None:
            found = self._kinds[kind] = _classify(kind, self.pickled)
        return found

    def _visit(self, path: str, obj: Any) -> int:
        kind = self._kind(type(obj))
        if kind == _HANDLE:
            self.handles.append((path, obj))
        elif kind == _TENSOR:
            self.tensors.append((path, obj))
        elif kind == _ARRAY:
            if obj.dtype.kind == "O" and obj.size > LARGE_CONTAINER:
                self.containers.append((path, obj))
        elif kind in (_MAPPING, _SEQUENCE) and len(obj) > LARGE_CONTAINER:
            self.containers.append((path, obj))
        return kind

    def _attrs(self, obj: Any) -> Iterator[Child]:
        """An instance's ``__dict__`` entries and ``__slots__``, without ``__getattr__``."""
        try:
            state = object.__getattribute__(obj, "__dict__")
        except Exception:
            state = None
        if type(state) is dict:
            yield from ((f".{k}", v) for k, v in itertools.islice(state.items(), MAX_ITEMS))
        slots = self._slots.get(type(obj))
        if slots is None:
            slots = self._slots[type(obj)] = _slot_names(type(obj))
        for name in slots:
            try:
                yield (f".{name}", object.__getattribute__(obj, name))
            except Exception:  # unset slot, or a descriptor that refuses
                continue

    def _children(self, obj: Any, kind: int) -> Iterable[Child]:
        if kind == _MAPPING:
            pairs = itertools.islice(dict.items(obj), MAX_ITEMS)
            items = ((f"[{_short_repr(k)}]", v) for k, v in pairs)
            return itertools.chain(items, self._attrs(obj))
        if kind == _SEQUENCE:
            name = ".<item #{}>" if isinstance(obj, (set, frozenset)) else "[{}]"
            first = enumerate(itertools.islice(iter(obj), MAX_ITEMS))
            return itertools.chain(((name.format(i), x) for i, x in first), self._attrs(obj))
        if kind == _OBJECT:
            return self._attrs(obj)
        if kind == _FUNCTION:
            return _function_children(obj)
        if kind == _METHOD:
            return [(".__self__", obj.__self__)]
        if kind == _PARTIAL:
            return [
                (".func", obj.func),
                *((f".args[{i}]", a) for i, a in enumerate(obj.args[:MAX_ITEMS])),
                *((f".keywords[{k!r}]", v) for k, v in obj.keywords.items()),
            ]
        if kind == _CURSOR:
            return [(".connection", obj.connection)]
        return ()


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
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and issubclass(kind, sqlite3.Cursor):
        return _CURSOR
    if within(module, _OPAQUE_MODULES):
        return _OPAQUE
    if issubclass(kind, dict):
        return _MAPPING
    if issubclass(kind, (list, tuple, set, frozenset, collections.deque)):
        return _SEQUENCE
    if issubclass(kind, types.FunctionType):
        return _FUNCTION
    if issubclass(kind, types.MethodType):
        return _METHOD
    if issubclass(kind, functools.partial):
        return _PARTIAL
    if pickled and _pickles_itself(kind):
        return _OPAQUE
    return _OBJECT


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


def _slot_names(kind: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in _NO_SLOTS:
                continue
            if name.startswith("__") and not name.endswith("__"):  # name-mangled
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return tuple(names)


def _function_children(func: types.FunctionType) -> list[Child]:
    """What a function carries: closure, defaults; its globals if cloudpickle copies them."""
    code = func.__code__
    parts: list[Child] = []
    for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False):
        try:
            parts.append((f".<closure var {name!r}>", cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    parts += [(f".<default {i}>", d) for i, d in enumerate(func.__defaults__ or ())]
    parts += [(f".<default {k!r}>", d) for k, d in (func.__kwdefaults__ or {}).items()]
    if _sent_by_value(func):
        names = [n for n in _global_names(code) if n in func.__globals__]
        parts += [(f".<global {n!r}>", func.__globals__[n]) for n in names[:MAX_ITEMS]]
    return parts


def _sent_by_value(func: types.FunctionType) -> bool:
    """cloudpickle's rule: a function it cannot import by name travels by value."""
    module = sys.modules.get(func.__module__ or "")
    if module is None or func.__module__ == "__main__":
        return True
    found: Any = module
    for part in func.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is not func


def handle_kind(kind: type) -> str | None:
    """``"file"``, ``"sqlite"``, ``"socket"``, ``"lmdb"`` or ``"hdf5"`` for a handle's type."""
    if issubclass(kind, io.IOBase):
        return "file"
    for module_name, attrs, name in _NATIVE_HANDLES:
        module = sys.modules.get(module_name)  # never imported here: only if the program did
        classes = tuple(c for c in (getattr(module, a, None) for a in attrs) if isinstance(c, type))
        if classes and issubclass(kind, classes):
            return name
    return None
