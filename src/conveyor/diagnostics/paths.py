"""The parts an object is made of, and the one way diagnostics name them.

Every message that points into the user's objects — ``conveyor.check()``, the
automatic pre-flight, the :class:`~conveyor.errors.UnpicklableError` raised at
``iter()``, the error for a sample that cannot be sent back — names a part by
its path from a root the user knows (``dataset``, ``collate_fn``,
``worker_init_fn``, ``sample``), in one grammar::

    .name                 an attribute: __dict__ entry or slot (a class's, pickled by value)
    [0]  ['key']          an item of a list, tuple or deque; a dict's value, by its key's repr
    .<key #0>             a dict's key itself (the n-th)
    .<item #0>            a set's member (the n-th met)
    .func  .args[0]  .keywords['k']            a functools.partial
    .__self__  .__func__                       a bound method
    .<closure var 'x'>  .<global 'x'>  .<default 'x'>   a function: what it closes over,
                          a global it takes along when pickled by value, parameter x's default
    .__class__  .__bases__[0]                  a class pickled by value
    .__getstate__()  .__reduce__()[2]  .__getnewargs__()[0]   an object's own pickled form

:func:`held_parts` is what an object holds in memory (what a forked worker
shares); :func:`pickled_parts` is what pickle sends (through ``__reduce_ex__``,
so only for an object known to fail). They name a part they both see the same
way: ``dataset.db.conn``, ``collate_fn.<default 'fh'>``.
"""

from __future__ import annotations

import collections
import dis
import functools
import itertools
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Parts",
    "global_names",
    "held_parts",
    "pickled_parts",
    "sent_by_value",
    "short",
    "short_repr",
    "type_name",
]

_SEQUENCES = (list, tuple, collections.deque)
_SETS = (set, frozenset)
_BUILTIN_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
_NO_SLOTS = frozenset({"__dict__", "__weakref__"})
_CLASS_SKIP = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "_abc_impl"}
# C objects whose parts are getters, not __dict__ entries: (module, class, attributes).
_C_ATTRIBUTES = (("sqlite3", "Cursor", ("connection",)),)
_SLOTS: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Parts:
    """Children of one kind: ``values[i]`` is named ``parent + suffix(i)`` (named lazily:
    a million list items cost nothing until one of them is reported)."""

    values: Sequence[Any]
    suffix: Callable[[int], str]


def held_parts(obj: Any, limit: int | None = None) -> list[Parts]:
    """What ``obj`` holds: items, attributes (never through ``__getattr__`` or
    properties), a function's closure, defaults and the globals cloudpickle would
    take along. ``limit``: at most that many of each kind (the first ones)."""
    groups = _items(obj, limit, keys=False)
    if type(obj) in _BUILTIN_CONTAINERS:
        return groups
    special = _special(obj, limit, by_value=True)
    return [*groups, *(special if special is not None else [_named(_attributes(obj, limit))])]


def pickled_parts(obj: Any, *, by_value: bool = True) -> list[Parts]:
    """What pickle sends for ``obj``. ``by_value``: functions and classes that cannot
    be imported by name travel by value (cloudpickle); else they are leaves."""
    groups = _items(obj, None, keys=True)
    if type(obj) in _BUILTIN_CONTAINERS:
        return groups
    special = _special(obj, None, by_value=by_value)
    if special is not None:
        return [*groups, *special]
    if isinstance(obj, type):
        if not by_value:
            return []
        slots = obj.__dict__.get("__slots__", ())
        skip = _CLASS_SKIP | ({slots} if isinstance(slots, str) else set(slots))
        parts = [(f".{k}", v) for k, v in vars(obj).items() if k not in skip]
        return [_named(parts + [(f".__bases__[{i}]", b) for i, b in enumerate(obj.__bases__)])]
    return [*groups, _named(_state(obj))]


def _items(obj: Any, limit: int | None, *, keys: bool) -> list[Parts]:
    if isinstance(obj, dict):
        pairs = list(itertools.islice(dict.items(obj), limit))
        groups = [Parts([v for _, v in pairs], lambda i: f"[{short_repr(pairs[i][0])}]")]
        return groups + ([Parts([k for k, _ in pairs], ".<key #{}>".format)] if keys else [])
    if isinstance(obj, _SEQUENCES):
        return [Parts(list(itertools.islice(obj, limit)), "[{}]".format)]
    if isinstance(obj, _SETS):
        return [Parts(list(itertools.islice(obj, limit)), ".<item #{}>".format)]
    return []


def _special(obj: Any, limit: int | None, *, by_value: bool) -> list[Parts] | None:
    """Partials, methods and functions (the same parts in memory and pickled)."""
    if isinstance(obj, functools.partial):
        parts: list[tuple[str, Any]] = [(".func", obj.func)]
        parts += [(f".args[{i}]", a) for i, a in enumerate(obj.args[:limit])]
        parts += [(f".keywords[{k!r}]", v) for k, v in obj.keywords.items()]
        return [_named(parts + _attributes(obj, limit))]
    if isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
        parts = [(".__self__", obj.__self__)]
        parts += [(".__func__", obj.__func__)] if isinstance(obj, types.MethodType) else []
        return [_named(parts)]
    if isinstance(obj, types.FunctionType):
        return [_named(_function_parts(obj, limit))] if by_value else []
    return None


def _function_parts(func: types.FunctionType, limit: int | None) -> list[tuple[str, Any]]:
    """Closure, defaults (by parameter name), globals if sent by value, ``__dict__``."""
    code = func.__code__
    parts: list[tuple[str, Any]] = []
    for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False):
        try:
            parts.append((f".<closure var {name!r}>", cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    if sent_by_value(func):
        names = [n for n in global_names(code) if n in func.__globals__][:limit]
        parts += [(f".<global {n!r}>", func.__globals__[n]) for n in names]
    params = code.co_varnames[: code.co_argcount]
    defaults = func.__defaults__ or ()
    with_defaults = params[len(params) - len(defaults) :]
    parts += [(f".<default {n!r}>", d) for n, d in zip(with_defaults, defaults, strict=False)]
    parts += [(f".<default {n!r}>", d) for n, d in (func.__kwdefaults__ or {}).items()]
    return parts + [(f".{k}", v) for k, v in func.__dict__.items()]


def _attributes(obj: Any, limit: int | None) -> list[tuple[str, Any]]:
    """``__dict__`` entries and ``__slots__``, read without ``__getattr__`` or properties."""
    try:
        state = object.__getattribute__(obj, "__dict__")
    except Exception:
        state = None
    parts = []
    if type(state) is dict:
        parts = [(f".{k}", v) for k, v in itertools.islice(state.items(), limit)]
    for name in _slot_names(type(obj)) + _c_attributes(type(obj)):
        try:
            parts.append((f".{name}", object.__getattribute__(obj, name)))
        except Exception:  # unset slot, or a descriptor that refuses
            continue
    return parts


def _state(obj: Any) -> list[tuple[str, Any]]:
    """An object's parts as pickle sees them, through ``__reduce_ex__`` (none if it raises)."""
    try:
        reduced = obj.__reduce_ex__(5)  # the protocol cloudpickle and samples use
    except Exception:
        return []
    if not isinstance(reduced, tuple):
        return []  # pickled by name
    kind = type(obj)
    args = reduced[1] if len(reduced) > 1 and isinstance(reduced[1], tuple) else ()
    state = reduced[2] if len(reduced) > 2 else None
    custom_ex = getattr(kind, "__reduce_ex__", None) is not object.__reduce_ex__
    if custom_ex or getattr(kind, "__reduce__", None) is not object.__reduce__:
        call = ".__reduce_ex__(5)" if custom_ex else ".__reduce__()"
        parts = [(f"{call}[0]", reduced[0]), *((f"{call}[1][{i}]", a) for i, a in enumerate(args))]
        return parts + ([(f"{call}[2]", state)] if state is not None else [])
    if getattr(kind, "__getstate__", None) not in (None, getattr(object, "__getstate__", None)):
        parts = [(".__getstate__()", state)]
    else:  # the instance __dict__, or (__dict__ or None, {slot: value}): attributes
        dicts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
        parts = [(f".{k}", v) for d in dicts if isinstance(d, dict) for k, v in d.items()]
    parts += [(f".__getnewargs__()[{i}]", a) for i, a in enumerate(args[1:])]
    return [*parts, (".__class__", kind)]


def _named(parts: list[tuple[str, Any]]) -> Parts:
    return Parts([value for _, value in parts], lambda i: parts[i][0])


def _slot_names(kind: type) -> tuple[str, ...]:
    found = _SLOTS.get(kind)
    if found is None:
        found = _SLOTS[kind] = _find_slot_names(kind)
    return found


def _find_slot_names(kind: type) -> tuple[str, ...]:
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


def _c_attributes(kind: type) -> tuple[str, ...]:
    for module_name, class_name, names in _C_ATTRIBUTES:
        klass = getattr(sys.modules.get(module_name), class_name, None)  # never imported here
        if isinstance(klass, type) and issubclass(kind, klass):
            return names
    return ()


def global_names(code: types.CodeType) -> list[str]:
    """Global names a function's code (and the code nested in it) reads or writes."""
    names: dict[str, None] = {}
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"):
            names[str(ins.argval)] = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(global_names(const)))
    return list(names)


def sent_by_value(func: types.FunctionType) -> bool:
    """cloudpickle's rule: a function it cannot import by name travels by value."""
    module = sys.modules.get(func.__module__ or "")
    if module is None or func.__module__ == "__main__":
        return True
    found: Any = module
    for part in func.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is not func


def type_name(obj: Any) -> str:
    kind = type(obj)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def short_repr(value: Any, limit: int = 60) -> str:
    try:
        return short(repr(value), limit)
    except Exception:
        return f"<{type_name(value)}>"


def short(text: str, limit: int = 200) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."
