"""Messages for collate failures: what happened, where, why, and the fix.

Nothing here runs unless collation has already failed, so the happy path pays
for none of it. Each ``raise_*`` function raises a :class:`CollateError`
subclass that is also the built-in type torch raises for the same mistake.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from conveyor.errors import (
    CollateError,
    CollateKeyError,
    CollateShapeError,
    CollateTypeError,
    CollateTypeRuntimeError,
    CollateTypeValueError,
)

BATCH_INDICES: contextvars.ContextVar[tuple[Any, ...] | None] = contextvars.ContextVar(
    "conveyor_collate_batch_indices", default=None
)

_LIST_LIMIT = 8
_GROUP_LIMIT = 6
_KEY_LIMIT = 12
_TORCH_FORMAT = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)
_CUSTOM_COLLATE = "pass a collate_fn to the DataLoader that"


class Attr(str):
    """A namedtuple field name in a path, shown as ``.name``."""

    __slots__ = ()


@contextlib.contextmanager
def collate_context(indices: Sequence[Any] | None) -> Iterator[None]:
    """Tell collate the dataset indices of the batch it is about to build.

    Error messages then name dataset indices instead of batch positions.
    """
    token = BATCH_INDICES.set(None if indices is None else tuple(indices))
    try:
        yield
    finally:
        BATCH_INDICES.reset(token)


def format_path(path: tuple[Any, ...]) -> str:
    return "".join(f".{p}" if isinstance(p, Attr) else f"[{p!r}]" for p in path)


def _at(path: tuple[Any, ...]) -> str:
    return f" at {format_path(path)}" if path else ""


def _indices(size: int) -> tuple[Any, ...]:
    known = BATCH_INDICES.get()
    return known if known is not None and len(known) == size else ()


def _positions(positions: Sequence[int], size: int) -> str:
    """``dataset indices 5, 9 (batch positions 3, 7)`` or ``batch positions 3, 7``."""
    known = _indices(size)
    shown = positions[:_LIST_LIMIT]
    cut = len(positions) > len(shown)
    plural = len(positions) > 1
    pos = f"batch position{'s' if plural else ''} " + ", ".join(map(str, shown))
    if not known:
        return pos + (f", ... ({len(positions)} in all)" if cut else "")
    idx = ", ".join(repr(known[i]) for i in shown)
    more = (", ...", f", ...; {len(positions)} in all") if cut else ("", "")
    return f"dataset {'indices' if plural else 'index'} {idx}{more[0]} ({pos}{more[1]})"


def _groups(values: Sequence[Any]) -> list[tuple[Any, list[int]]]:
    """Positions grouped by value, the most common value first."""
    groups: dict[Any, list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault(v, []).append(i)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def _describe_groups(values: Sequence[Any], show: Any = repr) -> str:
    groups = _groups(values)
    parts = [f"{show(v)} at {_positions(ps, len(values))}" for v, ps in groups[:_GROUP_LIMIT]]
    if len(groups) > _GROUP_LIMIT:
        parts.append(f"... and {len(groups) - _GROUP_LIMIT} more")
    return "; ".join(parts)


def type_name(t: type) -> str:
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _error(
    cls: type[CollateError],
    lines: list[str],
    path: tuple[Any, ...],
    size: int,
    culprits: Sequence[int] = (),
) -> Any:
    """``culprits``: the batch positions of the samples at fault, when only some are."""
    known = _indices(size)
    at_fault = tuple(known[p] for p in culprits) if known and len(culprits) < size else ()
    return cls("\n".join(lines), path=format_path(path), indices=known, culprits=at_fault)


def _not_most_common(values: Sequence[Any]) -> list[int]:
    """The positions whose value differs from the one most samples have."""
    common = _groups(values)[0][0]
    return [i for i, v in enumerate(values) if v != common]


def raise_with_note(exc: BaseException, path: tuple[Any, ...], size: int) -> NoReturn:
    """Re-raise ``exc`` unchanged but for a note saying where collate was."""
    known = _indices(size)
    note = f"Raised by default_collate{_at(path)}" + (
        f" of a batch with dataset indices {list(known)}" if known else ""
    )
    notes = list(getattr(exc, "__notes__", None) or [])
    notes.append(note + ".")
    with contextlib.suppress(AttributeError):
        exc.__notes__ = notes  # type: ignore[attr-defined]
    raise exc


def raise_registered(
    exc: BaseException, fn: Any, key: Any, path: tuple[Any, ...], size: int
) -> NoReturn:
    """Re-raise what a registered collate function raised, noting which one and where."""
    known = _indices(size)
    name = getattr(fn, "__qualname__", None) or type_name(type(fn))
    module = getattr(fn, "__module__", None)
    shown = f"{module}.{name}" if module and module != "builtins" else name
    keys = key if isinstance(key, tuple) else (key,)
    types = ", ".join(type_name(k) if isinstance(k, type) else repr(k) for k in keys)
    note = f"Raised by {shown}, the collate function registered for {types}{_at(path)}" + (
        f", in a batch with dataset indices {list(known)}" if known else ""
    )
    notes = list(getattr(exc, "__notes__", None) or [])
    notes.append(note + ".")
    with contextlib.suppress(AttributeError):
        exc.__notes__ = notes  # type: ignore[attr-defined]
    raise exc


def _type_error_class(exc: BaseException) -> type[CollateError] | None:
    if isinstance(exc, TypeError):
        return CollateTypeError
    if isinstance(exc, RuntimeError):
        return CollateTypeRuntimeError
    if isinstance(exc, ValueError):
        return CollateTypeValueError
    return None


def raise_leaf(batch: Sequence[Any], path: tuple[Any, ...], exc: Exception) -> NoReturn:
    """Explain why tensors, arrays or numbers at ``path`` could not be batched."""
    if isinstance(exc, CollateError):
        raise exc
    types = [type(x) for x in batch]
    cls = _type_error_class(exc)
    if cls is not None and len(set(types)) > 1:
        first = type_name(types[0])
        raise _error(
            cls,
            [
                f"Cannot batch the values{_at(path)}: the samples hold different types.",
                f"Types: {_describe_groups(types, type_name)}.",
                f"Why: every sample must hold the same kind of value here as the first "
                f"sample ({first}); the error was {type(exc).__name__}: {exc}",
                f"Fix: make __getitem__ return a {first} here for every index (None often "
                f"means a failed load or a missing label), or {_CUSTOM_COLLATE} handles it.",
            ],
            path,
            len(batch),
            [i for i, t in enumerate(types) if t is not types[0]],
        ) from exc
    shapes = [tuple(getattr(x, "shape", ())) for x in batch]
    if isinstance(exc, (RuntimeError, ValueError)) and len(set(shapes)) > 1:
        raise_shapes(batch, path, shapes, exc)
    raise_with_note(exc, path, len(batch))


def raise_shapes(
    batch: Sequence[Any], path: tuple[Any, ...], shapes: list[tuple[int, ...]], exc: Exception
) -> NoReturn:
    raise _error(
        CollateShapeError,
        [
            f"Cannot stack the arrays{_at(path)}: they have different shapes.",
            f"Shapes: {_describe_groups(shapes)}.",
            "Why: default_collate stacks them into one tensor of shape (batch_size, *shape), "
            "which needs the same shape in every sample.",
            "Fix: resize, crop or pad to one shape in the dataset, or "
            f"{_CUSTOM_COLLATE} pads them (e.g. torch.nn.utils.rnn.pad_sequence) "
            "or keeps them as a list.",
        ],
        path,
        len(batch),
        _not_most_common(shapes),
    ) from exc


def raise_lengths(batch: Sequence[Any], path: tuple[Any, ...]) -> NoReturn:
    raise _error(
        CollateShapeError,
        [
            "each element in list of batch should be of equal size: the sequences"
            f"{_at(path)} have different lengths.",
            f"Lengths: {_describe_groups([len(s) for s in batch])}.",
            "Why: default_collate transposes a batch of sequences position by position, "
            "which needs every sample's sequence to have the same length.",
            f"Fix: pad or truncate to one length in the dataset, or {_CUSTOM_COLLATE} "
            "pads them or keeps them as lists.",
        ],
        path,
        len(batch),
        _not_most_common([len(s) for s in batch]),
    )


def raise_unsupported(batch: Sequence[Any], path: tuple[Any, ...], what: Any = None) -> NoReturn:
    """The first sample holds something collate cannot batch (``what``: a dtype)."""
    elem = batch[0]
    found = type(elem) if what is None else what
    same = [i for i, x in enumerate(batch) if type(x) is type(elem)]
    if elem is None:
        desc = "None"
        fix = (
            "the dataset returned None (often a failed load or a missing value): fix "
            f"__getitem__, or {_CUSTOM_COLLATE} drops or replaces such samples."
        )
    elif what is not None:
        desc = f"numpy arrays of dtype {what}"
        fix = (
            "convert them to numbers in __getitem__ (e.g. a label index), return str or "
            f"a list of str (kept as lists), or {_CUSTOM_COLLATE} handles them."
        )
    else:
        desc = f"values of type {type_name(type(elem))}"
        fix = (
            "convert them to a number, numpy array or tensor in __getitem__, or "
            f"{_CUSTOM_COLLATE} handles {type_name(type(elem))}."
        )
    lines = [f"Cannot batch {desc}{_at(path)} ({_positions(same, len(batch))})."]
    if len(same) < len(batch):
        lines.append(f"Types: {_describe_groups([type(x) for x in batch], type_name)}.")
    lines += [f"Why: {_TORCH_FORMAT.format(found)}.", f"Fix: {fix}"]
    raise _error(CollateTypeError, lines, path, len(batch), same)


def raise_tensor_layout(batch: Sequence[Any], path: tuple[Any, ...], kind: str) -> NoReturn:
    raise _error(
        CollateTypeRuntimeError,
        [
            f"Cannot batch {kind} tensors{_at(path)}.",
            f"Why: Batches of {kind} tensors are not currently supported by the default "
            "collate_fn.",
            f"Fix: {_CUSTOM_COLLATE} handles them, or return dense tensors.",
        ],
        path,
        len(batch),
    )


def raise_gather(batch: Sequence[Any], path: tuple[Any, ...], key: Any, exc: Exception) -> NoReturn:
    """A sample could not give ``key``, which the first sample (a mapping) has."""
    others = [i for i, d in enumerate(batch) if not isinstance(d, Mapping)]
    if others and isinstance(exc, TypeError):
        raise_leaf(batch, path, exc)
    missing = [i for i, d in enumerate(batch) if isinstance(d, Mapping) and key not in d]
    if not missing or not isinstance(exc, KeyError):
        raise_with_note(exc, (*path, key), len(batch))
    key_sets = [frozenset(d) for d in batch if isinstance(d, Mapping)]
    seen = "; ".join(
        f"{_show_keys(ks)} in {n} sample{'s' if n > 1 else ''}"
        for ks, n in Counter(key_sets).most_common(_GROUP_LIMIT)
    )
    raise _error(
        CollateKeyError,
        [
            f"Key {key!r} is missing{_at(path)} in {len(missing)} of {len(batch)} samples: "
            f"{_positions(missing, len(batch))}.",
            f"Key sets seen: {seen}.",
            "Why: default_collate batches every key of the first sample, so every sample "
            "must have it.",
            "Fix: return the same keys for every index in __getitem__ (fill a default for "
            f"absent ones), or {_CUSTOM_COLLATE} handles optional keys.",
        ],
        path,
        len(batch),
        missing,
    ) from exc


def _show_keys(keys: frozenset[Any]) -> str:
    shown = sorted(map(repr, keys))
    more = f", ... ({len(shown)} keys)" if len(shown) > _KEY_LIMIT else ""
    return "{" + ", ".join(shown[:_KEY_LIMIT]) + more + "}"


def raise_not_sequence(batch: Sequence[Any], path: tuple[Any, ...], exc: Exception) -> NoReturn:
    if any(not hasattr(x, "__len__") or not hasattr(x, "__iter__") for x in batch):
        raise_leaf(batch, path, exc)
    raise_with_note(exc, path, len(batch))
