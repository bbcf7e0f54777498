"""Name the part of an object that cannot be pickled, and say how to fix it.

:func:`find_unpicklable` pickles the object once; only if that fails does it
search the object's parts as pickle sees them (:func:`~.paths.pickled_parts`:
attributes, ``__getstate__`` and ``__reduce__`` results, slots, items, closures,
defaults and globals of functions pickled by value) and report the deepest parts
that fail on their own, named in the one path grammar of :mod:`.paths`.
:func:`explain_unpicklable` turns that into an :class:`UnpicklableError` whose
fix is the one :func:`~.fixes.fix_for` gives ``conveyor.check()``.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from .._transport.main_classes import reduce_sent_class
from .._workers.start_method import StartMethod
from ..errors import UnpicklableError
from .fixes import fix_for, sharing_is_a_hazard
from .handles import Handle, describe_handle
from .paths import pickled_parts, short, short_repr, type_name

__all__ = [
    "PicklingFinding",
    "explain_unpicklable",
    "explain_unpicklable_sample",
    "find_unpicklable",
    "why_unpicklable",
]

Dumps = Callable[[Any], bytes]
_MAX_DEPTH = 64
_ONE_BY_ONE = 4  # ranges of children this small are pickled one at a time, larger ones bisected


@dataclass(frozen=True)
class PicklingFinding:
    """One part that cannot be pickled: where (``dataset.db.connection``), what, why;
    ``handle`` when it is an open handle (what reopening it takes)."""

    path: str
    type_name: str
    reason: str
    handle: Handle | None = field(default=None, compare=False)
    class_name: str | None = None  # the part is a class (module.qualname) pickle cannot name

    def fix(self) -> str:
        """The fix, without a final period (see :func:`~.fixes.fix_for`)."""
        return fix_for(self.path, self.type_name, self.handle)

    def why(self) -> str:
        if self.class_name is not None:
            return (
                f"{self.path} is the class {self.class_name}, which the main process cannot "
                f"find by its module and name ({self.reason})."
            )
        return why_unpicklable(self.path, self.type_name, self.reason)


def why_unpicklable(path: str, type_name: str, reason: str) -> str:
    """``dataset.fh is a _io.TextIOWrapper, which cannot be pickled.``: conveyor's words,
    with the error's own (``reason``) only where they say more than that its type cannot
    be pickled (a ``__reduce__`` of the user's explaining why). Python words that plain
    refusal differently from version to version ("cannot pickle '_io.TextIOWrapper'
    object", then "cannot pickle 'TextIOWrapper' instances"), always naming the type.
    """
    article = "an" if type_name[:1].lower() in "aeiou" else "a"
    why = f"{path} is {article} {type_name}, which cannot be pickled"
    if type_name.rsplit(".", 1)[-1] in reason:
        return why + "."
    return f"{why} ({reason})."


def find_unpicklable(
    obj: Any, root: str = "dataset", *, dumps: Dumps = cloudpickle.dumps, max_findings: int = 5
) -> list[PicklingFinding]:
    """Return the deepest parts of ``obj`` that ``dumps`` cannot pickle. Never raises."""
    search = _Search(dumps, max_findings)
    if (error := search.error(obj)) is None:
        return []
    search.by_value = search.error(lambda: None) is None  # pickles local functions (cloudpickle)
    with contextlib.suppress(Exception):  # a pathological object: keep what was found
        search.walk(obj, root, error, 0)
    return search.findings


class _Search:
    """Depth-first through the parts that fail to pickle, bisecting large groups."""

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
            groups = pickled_parts(obj, by_value=self.by_value) if depth < _MAX_DEPTH else []
        except Exception:  # a part that cannot be inspected: obj is as deep as we get
            groups = []
        failing_child = False
        for group in groups:
            for i, child, child_error in self.scan(group.values, 0, len(group.values)):
                failing_child = True  # a child already seen also accounts for the failure
                if len(self.findings) >= self.max_findings:
                    return
                if child_error is not None:
                    self.walk(child, path + group.suffix(i), child_error, depth + 1)
        if not failing_child and len(self.findings) < self.max_findings:
            reason = short(str(error) or type(error).__name__)
            named = f"{obj.__module__}.{obj.__qualname__}" if issubclass(type(obj), type) else None
            found = PicklingFinding(path, type_name(obj), reason, describe_handle(obj), named)
            self.findings.append(found)

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


_SAMPLE_FIX = (
    "return plain data (arrays, numbers, strings) from __getitem__; "
    "open resources inside it and close them before returning."
)
_CONTEXT_NAMES = {"start_method": "start method", "index": "dataset index"}
_CONTEXT_NAMES.update(indices="dataset indices", worker_id="worker")


class _SamplePickler(pickle.Pickler):
    """What a worker's batch pickler does with classes: one the main process sent by
    value goes back by reference (see conveyor._transport.main_classes)."""

    def reducer_override(self, obj: Any) -> Any:
        return reduce_sent_class(obj) or NotImplemented


def _pickle5(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _SamplePickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


def _sample_fix(findings: Sequence[PicklingFinding]) -> str:
    """The fix for a sample that cannot go back: where a class is at fault, where to
    define it."""
    classes = list(dict.fromkeys(f.class_name for f in findings if f.class_name))
    if not classes:
        return _SAMPLE_FIX
    return (
        f"define {', '.join(classes)} at the top level of a module or of the training script, "
        "not inside a function nor only in the worker, so that the main process finds it by "
        "its module and name (a class of the script's own comes back as that class)."
    )


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
    "sampler", "sample"); keyword ``context`` (``start_method='spawn'`` or a
    :class:`~conveyor.config.StartMethod`, ``worker_id=3``, ``index=7``...) lands in
    the message. A recognised handle gets the precise ``conveyor.per_worker`` recipe
    (its real path and mode), as in ``conveyor.check()``. The caller chains it to
    the original error: ``raise explain_unpicklable(...) from error``.
    """
    findings = find_unpicklable(obj, root, dumps=dumps)
    sample = role == "sample"
    raw_method = context.get("start_method")
    method = StartMethod(str(raw_method)) if raw_method is not None else None
    if method is not None:
        context["start_method"] = method.name
    what = "A worker cannot send a sample back" if sample else f"Cannot send the {role}"
    what += "" if sample else " to worker processes"
    where = [f"{_CONTEXT_NAMES.get(k, k)} {short_repr(v, 120)}" for k, v in context.items()]
    what += f" ({', '.join(where)}): " if where else ": "
    if not findings:
        reason = short(str(error) or type(error).__name__)
        findings = [PicklingFinding(root, type_name(obj), reason, describe_handle(obj))]
        why = f"{root} cannot be pickled ({reason})."
    else:
        why = findings[0].why()
        if len(findings) > 1:
            why += " Also: " + "; ".join(f"{f.path} ({f.type_name})" for f in findings[1:]) + "."
    fix = "; ".join(dict.fromkeys(f.fix() for f in findings))
    # Fork is no way out for a handle: forked workers would share it, which
    # corrupts reads (see the fork pre-flight). Only suggest it for the rest.
    hazard = any(sharing_is_a_hazard(f.type_name, f.handle) for f in findings)
    if method is not None and method.pickles_objects and not hazard:
        fix += ", or use multiprocessing_context='fork'"
    fix = _sample_fix(findings) if sample else fix + "."
    path, kind = findings[0].path, findings[0].type_name
    return UnpicklableError(f"{what}{why} Fix: {fix}", path=path, type_name=kind)


def explain_unpicklable_sample(
    sample: Any, error: BaseException, *, indices: Any, dumps: Dumps = _pickle5, **context: Any
) -> UnpicklableError:
    """Build the error for a worker's result that cannot be pickled back to the main process.

    ``indices`` are the dataset indices the sample (or batch) came from. Samples go
    through the standard ``pickle`` (protocol 5), not cloudpickle: a lambda fails too,
    and so does a class the main process cannot find by name (made in a function).
    """
    one = isinstance(indices, (list, tuple)) and len(indices) == 1
    where = {"index": indices[0]} if one else {"indices": indices}
    return explain_unpicklable(
        sample, "sample", error, role="sample", dumps=dumps, **where, **context
    )
