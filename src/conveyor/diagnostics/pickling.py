"""Name the part of an object that cannot be pickled, and say how to fix it.

:func:`find_unpicklable` pickles the object once; only if that fails does it
walk the object graph the way pickle does (attributes, ``__getstate__`` and
``__reduce__`` results, ``__slots__``, items, closures and globals of functions
pickled by value) and report the deepest parts that fail on their own.
:func:`explain_unpicklable` turns that into an :class:`UnpicklableError`.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import pickle
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from conveyor.errors import UnpicklableError

__all__ = [
    "PicklingFinding",
    "explain_unpicklable",
    "explain_unpicklable_sample",
    "find_unpicklable",
]

Dumps = Callable[[Any], bytes]
_Group = tuple[Sequence[Any], Callable[[int], str]]  # children and how to name the i-th
_MAX_DEPTH = 64
_ONE_BY_ONE = 4  # ranges of children this small are pickled one at a time, larger ones bisected
_CLASS_SKIP = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "_abc_impl"}


@dataclass(frozen=True)
class PicklingFinding:
    """One part that cannot be pickled: where (``dataset.db.connection``), what, why."""

    path: str
    type_name: str
    reason: str


def find_unpicklable(
    obj: Any, root: str = "dataset", *, dumps: Dumps = cloudpickle.dumps, max_findings: int = 5
) -> list[PicklingFinding]:
    """Return the deepest parts of ``obj`` that ``dumps`` cannot pickle. Never raises."""
    walker = _Walker(dumps, max_findings)
    if (error := walker.error(obj)) is None:
        return []
    walker.by_value = walker.error(lambda: None) is None  # pickles local functions (cloudpickle)
    with contextlib.suppress(Exception):  # a pathological object: keep what was found
        walker.walk(obj, root, error, 0)
    return walker.findings


class _Walker:
    def __init__(self, dumps: Dumps, max_findings: int) -> None:
        self.dumps = dumps
        self.max_findings = max(1, max_findings)
        self.seen: dict[int, Any] = {}  # id -> object, kept alive so ids stay unique
        self.findings: list[PicklingFinding] = []
        self.by_value = True  # whether dumps pickles functions and classes by value

    def error(self, obj: Any) -> Exception | None:
        try:
            self.dumps(obj)
        except Exception as exc:
            return exc
        return None

    def walk(self, obj: Any, path: str, error: Exception, depth: int) -> None:
        """Report the culprits under ``obj``, which is known to fail with ``error``."""
        self.seen[id(obj)] = obj
        try:
            groups = self.children(obj, path) if depth < _MAX_DEPTH else []
        except Exception:  # a part that cannot be inspected: obj is as deep as we get
            groups = []
        failing_child = False
        for values, name in groups:
            for i, child, child_error in self.scan(values, 0, len(values)):
                failing_child = True  # a child already seen also accounts for the failure
                if len(self.findings) >= self.max_findings:
                    return
                if child_error is not None:
                    self.walk(child, name(i), child_error, depth + 1)
        if not failing_child and len(self.findings) < self.max_findings:
            self.findings.append(
                PicklingFinding(path, _type_name(obj), _short(str(error) or type(error).__name__))
            )

    def scan(self, values: Sequence[Any], lo: int, hi: int) -> Iterator[tuple[int, Any, Any]]:
        """Yield ``(index, child, error)`` for failing children (error None: already seen)."""
        if hi - lo <= _ONE_BY_ONE:
            for i in range(lo, hi):
                child = values[i]
                if id(child) in self.seen:
                    yield i, child, None
                elif (child_error := self.error(child)) is not None:
                    yield i, child, child_error
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            if self.error(list(values[a:b])) is not None:
                yield from self.scan(values, a, b)

    def children(self, obj: Any, path: str) -> list[_Group]:
        groups: list[_Group] = []
        if isinstance(obj, (list, tuple)):
            groups.append((list(obj), lambda i: f"{path}[{i}]"))
        elif isinstance(obj, dict):
            keys, values = list(dict.keys(obj)), list(dict.values(obj))
            groups.append((values, lambda i: f"{path}[{_short_repr(keys[i])}]"))
            groups.append((keys, lambda i: f"{path}.<key #{i}>"))
        elif isinstance(obj, (set, frozenset)):
            groups.append((list(obj), lambda i: f"{path}.<item #{i}>"))
        if type(obj) in (list, tuple, dict, set, frozenset):
            return groups
        if isinstance(obj, functools.partial):
            parts = [(".func", obj.func), *_pairs(".args[{!r}]", enumerate(obj.args))]
            parts += _pairs(".keywords[{!r}]", obj.keywords.items())
            return [_named(path, parts + _pairs(".{}", getattr(obj, "__dict__", {}).items()))]
        if isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
            parts = [(".__self__", obj.__self__), (".__func__", getattr(obj, "__func__", None))]
            return [_named(path, parts)]
        if isinstance(obj, (types.FunctionType, type)) and not self.by_value:
            return []  # pickled by name: if that fails, the function or class is the culprit
        if isinstance(obj, types.FunctionType):
            return [_named(path, _function_parts(obj))]
        if isinstance(obj, type):
            slots = obj.__dict__.get("__slots__", ())
            skip = _CLASS_SKIP | ({slots} if isinstance(slots, str) else set(slots))
            parts = _pairs(".{}", ((k, v) for k, v in vars(obj).items() if k not in skip))
            return [_named(path, parts + _pairs(".__bases__[{!r}]", enumerate(obj.__bases__)))]
        return [*groups, _named(path, _state_parts(obj))]


def _function_parts(func: types.FunctionType) -> list[tuple[str, Any]]:
    """What cloudpickle pickles along with a function it pickles by value."""
    code = func.__code__
    cells = [cell.cell_contents for cell in func.__closure__ or ()]  # raises if one is empty
    params = code.co_varnames[: code.co_argcount]
    defaults = func.__defaults__ or ()
    with_defaults = params[len(params) - len(defaults) :]
    names = [n for n in _global_names(code) if n in func.__globals__]
    return [
        *_pairs(".<closure var {!r}>", zip(code.co_freevars, cells, strict=False)),
        *_pairs(".<global {!r}>", ((n, func.__globals__[n]) for n in names)),
        *_pairs(".<default {!r}>", zip(with_defaults, defaults, strict=False)),
        *_pairs(".<default {!r}>", (func.__kwdefaults__ or {}).items()),
        *_pairs(".{}", func.__dict__.items()),
    ]


def _state_parts(obj: Any) -> list[tuple[str, Any]]:
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
        parts = [(f"{call}[0]", reduced[0]), *_pairs(call + "[1][{!r}]", enumerate(args))]
        return parts + ([(f"{call}[2]", state)] if state is not None else [])
    if getattr(kind, "__getstate__", None) not in (None, getattr(object, "__getstate__", None)):
        parts = [(".__getstate__()", state)]
    else:  # the instance __dict__, or (__dict__ or None, {slot: value})
        dicts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
        parts = [p for d in dicts if isinstance(d, dict) for p in _pairs(".{}", d.items())]
    parts += _pairs(".__getnewargs__()[{!r}]", enumerate(args[1:]))
    return [*parts, (".__class__", kind)]


def _named(path: str, parts: list[tuple[str, Any]]) -> _Group:
    return [value for _, value in parts], lambda i: path + parts[i][0]


def _pairs(template: str, items: Iterable[tuple[Any, Any]]) -> list[tuple[str, Any]]:
    return [(template.format(key), value) for key, value in items]


def _global_names(code: types.CodeType) -> list[str]:
    """Global names a function's code (and the code nested in it) reads or writes."""
    names: dict[str, None] = {}
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"):
            names[str(ins.argval)] = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(_global_names(const)))
    return list(names)


def _type_name(obj: Any) -> str:
    kind = type(obj)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def _short_repr(value: Any, limit: int = 60) -> str:
    try:
        return _short(repr(value), limit)
    except Exception:
        return f"<{_type_name(value)}>"


def _short(text: str, limit: int = 200) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


_LAZY = "in each worker (in __getitem__ or worker_init_fn) instead of in __init__"
_FIXES = {  # words in the lowercased type name -> fix; the first match wins
    "_io. tempfile. file": "store conveyor.per_worker(open, path) instead: it opens the "
    "file lazily, once in each worker, and pickles as the recipe",
    "_thread. threading. synchronize. lock": f"create it lazily {_LAZY}",
    "generator coroutine iterator": "create it where it is consumed (in __iter__ or __getitem__)",
    "builtins.function builtins.type": "define it at module level (importable by name)",
    "sqlite3. socket ssl. connection cursor session client engine": "store "
    "conveyor.per_worker(<function that opens it>, <its arguments>) instead, e.g. "
    "conveyor.per_worker(sqlite3.connect, path): it connects lazily, once in each worker, "
    "and pickles as the recipe",
}
_HANDLE_FIX = _FIXES["sqlite3. socket ssl. connection cursor session client engine"]
_DEFAULT_FIX = (
    f"create it lazily {_LAZY}, or drop it in __getstate__ and rebuild it in __setstate__"
)
_SAMPLE_FIX = (
    "return plain data (arrays, numbers, strings) from __getitem__; "
    "open resources inside it and close them before returning."
)
_CONTEXT_NAMES = {"start_method": "start method", "index": "dataset index"}
_CONTEXT_NAMES.update(indices="dataset indices", worker_id="worker")
_PICKLE5: Dumps = functools.partial(pickle.dumps, protocol=5)


def _fix_for(type_name: str) -> str:
    hits = (
        fix for words, fix in _FIXES.items() if any(w in type_name.lower() for w in words.split())
    )
    return next(hits, _DEFAULT_FIX)


def explain_unpicklable(
    obj: Any,
    root: str,
    error: BaseException,
    *,
    role: str,
    dumps: Dumps = cloudpickle.dumps,
    **context: Any,
) -> UnpicklableError:
    """Build the error for ``obj`` (named ``root``) failing to pickle with ``error``.

    ``role`` says what was being sent ("dataset", "collate_fn", "worker_init_fn",
    "sampler", "sample"); keyword ``context`` (``start_method='spawn'``,
    ``worker_id=3``, ``index=7``...) lands in the message. The caller chains it to
    the original error: ``raise explain_unpicklable(...) from error``.
    """
    findings = find_unpicklable(obj, root, dumps=dumps)
    sample = role == "sample"
    what = "A worker cannot send a sample back" if sample else f"Cannot send the {role}"
    what += "" if sample else " to worker processes"
    where = [f"{_CONTEXT_NAMES.get(k, k)} {_short_repr(v, 120)}" for k, v in context.items()]
    what += f" ({', '.join(where)}): " if where else ": "
    if findings:
        path, type_name = findings[0].path, findings[0].type_name
        article = "an" if type_name[:1].lower() in "aeiou" else "a"
        why = f"{path} is {article} {type_name}, which cannot be pickled ({findings[0].reason})."
        if len(findings) > 1:
            why += " Also: " + "; ".join(f"{f.path} ({f.type_name})" for f in findings[1:]) + "."
    else:
        path, type_name = root, _type_name(obj)
        why = f"{root} cannot be pickled ({_short(str(error) or type(error).__name__)})."
    names = [f.type_name for f in findings] or [type_name]
    fix = "; ".join(dict.fromkeys(_fix_for(name) for name in names))
    # Fork is no way out for a handle: forked workers would share it, which
    # corrupts reads (see the fork pre-flight). Only suggest it for the rest.
    shared_handle = any(_fix_for(n) in (_FIXES["_io. tempfile. file"], _HANDLE_FIX) for n in names)
    if context.get("start_method") in ("spawn", "forkserver") and not shared_handle:
        fix += ", or use multiprocessing_context='fork'"
    fix = _SAMPLE_FIX if sample else fix + "."
    return UnpicklableError(f"{what}{why} Fix: {fix}", path=path, type_name=type_name)


def explain_unpicklable_sample(
    sample: Any, error: BaseException, *, indices: Any, dumps: Dumps = _PICKLE5, **context: Any
) -> UnpicklableError:
    """Build the error for a worker's result that cannot be pickled back to the main process.

    ``indices`` are the dataset indices the sample (or batch) came from. Samples go
    through the standard ``pickle`` (protocol 5), not cloudpickle: a lambda fails too.
    """
    one = isinstance(indices, (list, tuple)) and len(indices) == 1
    where = {"index": indices[0]} if one else {"indices": indices}
    return explain_unpicklable(
        sample, "sample", error, role="sample", dumps=dumps, **where, **context
    )
