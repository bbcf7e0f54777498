"""The walk of collate: each element of a batch to its rule, in torch's order.

:func:`collate_at` is what ``default_collate``, ``numpy_collate``, ``collate`` and the
streamed batch's columns all run: a registered function first (where registries hold
more than the defaults), then tensors, arrays, numbers and strings by the leaf rules it
is given, then mappings, namedtuples and sequences field by field. Which leaf rules and
which registries apply is the caller's choice (``collate.py`` makes it); this module
holds no state of its own. Errors are raised by ``_collate_errors``, naming the field.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

import numpy as np

from conveyor._workers import scope as _scope
from conveyor.collate import _errors as _err
from conveyor.collate import _leaves
from conveyor.collate._leaves import DEFERRED as _DEFERRED
from conveyor.collate._leaves import NP_SCALARS as _NP_SCALARS
from conveyor.collate._leaves import NUMPY as _NUMPY
from conveyor.collate._leaves import Leaves as _Leaves
from conveyor.collate._leaves import NeedsTorch as _NeedsTorch
from conveyor.collate._registry import Call, Dispatch, Rule

__all__ = [
    "by_rule",
    "collate_at",
    "make_tensors_in_main",
    "rebuild_mapping",
    "rebuild_sequence",
    "tensors_in_main",
]


def make_tensors_in_main(enabled: bool) -> None:
    """In a worker: stack into NumPy wherever that is exactly torch's result.

    The worker's transport then marks the arrays, and the main process makes
    the tensors while unpickling (``torch.from_numpy``, no copy): building
    tensors here only to take them apart for sending would cost more than
    the stacking itself for small samples. Set for the current worker core only.
    """
    scope = _scope.current()
    if scope is None:
        raise RuntimeError("make_tensors_in_main is for a worker core's own scope")
    scope.tensors_in_main = enabled


def tensors_in_main() -> bool:
    scope = _scope.current()
    return scope is not None and scope.tensors_in_main


def collate_at(
    batch: Sequence[Any], path: tuple[Any, ...], leaves: _Leaves, rules: Dispatch | None
) -> Any:
    """Collate ``batch`` at ``path``; ``rules``: the registries' lookup, None when
    they hold only the defaults (the built-in rules below give the same result)."""
    elem = batch[0]
    if rules is None:
        torch = _leaves.torch  # set once torch is adopted (collate._adopt_torch)
        if torch is not None and isinstance(elem, torch.Tensor):
            return leaves.tensor(batch, path)
        if isinstance(elem, np.ndarray):
            return leaves.array(batch, path)
        if isinstance(elem, _NP_SCALARS):
            return leaves.scalar(batch, path)
        if isinstance(elem, float):
            return leaves.float_(batch, path)
        if isinstance(elem, int):
            return leaves.int_(batch, path)
        if isinstance(elem, (str, bytes)):
            return batch
    else:
        action = rules.action(elem)
        if isinstance(action, Call):
            return _call_registered(action, batch, path, leaves)
        if action is not None:
            return by_rule(action, batch, path, leaves, rules)
    if isinstance(elem, Mapping):
        out: dict[Any, Any] = {}
        for key in elem:
            try:
                column = [d[key] for d in batch]
            except Exception as exc:
                _err.raise_gather(batch, path, key, exc)
            out[key] = collate_at(column, (*path, key), leaves, rules)
        return rebuild_mapping(elem, out)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        try:
            columns = list(zip(*batch, strict=False))
        except Exception as exc:
            _err.raise_not_sequence(batch, path, exc)
        names = [_err.Attr(f) for f in elem._fields]
        return type(elem)(
            *(collate_at(c, (*path, n), leaves, rules) for c, n in zip(columns, names, strict=True))
        )
    if isinstance(elem, Sequence):
        try:
            columns = list(zip(*batch, strict=True))
        except ValueError:
            _err.raise_lengths(batch, path)
        except TypeError as exc:
            _err.raise_not_sequence(batch, path, exc)
        items = [collate_at(c, (*path, i), leaves, rules) for i, c in enumerate(columns)]
        return items if isinstance(elem, tuple) else rebuild_sequence(elem, items)
    _err.raise_unsupported(batch, path)


def by_rule(
    rule: Rule, batch: Sequence[Any], path: tuple[Any, ...], leaves: _Leaves, rules: Any
) -> Any:
    """A built-in rule, found in a registry (a default function stands for it)."""
    if rule is Rule.TENSOR:
        return leaves.tensor(batch, path)
    if rule is Rule.ARRAY:
        if rules is not None and rules.tensor_custom and leaves is not _NUMPY:
            # torch turns the arrays into tensors and collates those through the map.
            if leaves is _DEFERRED:
                raise _NeedsTorch
            if batch[0].dtype.kind in "SUO":
                _err.raise_unsupported(batch, path, batch[0].dtype)
            try:
                tensors = [_leaves.torch.as_tensor(a) for a in batch]
            except Exception as exc:
                _err.raise_leaf(batch, path, exc)
            return collate_at(tensors, path, leaves, rules)
        return leaves.array(batch, path)
    if rule is Rule.SCALAR:
        return leaves.scalar(batch, path)
    if rule is Rule.FLOAT:
        return leaves.float_(batch, path)
    if rule is Rule.INT:
        return leaves.int_(batch, path)
    return batch  # Rule.STR


def _call_registered(
    call: Call, batch: Sequence[Any], path: tuple[Any, ...], leaves: _Leaves
) -> Any:
    """A registered function, run where torch runs it: here, on the samples."""
    if leaves is _DEFERRED:
        raise _NeedsTorch  # what it returns must reach the main process as it is
    if tensors_in_main():
        # A worker that defers torch: from now on it builds torch's batches itself,
        # and the transport sends NumPy arrays as arrays (see _workers/core.py).
        make_tensors_in_main(False)
    try:
        return call.fn(batch, collate_fn_map=call.collate_fn_map)
    except Exception as exc:
        _err.raise_registered(exc, call.fn, call.key, path, len(batch))


def rebuild_mapping(elem: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping like ``elem`` holding ``items``; a dict when that is not possible."""
    try:
        if isinstance(elem, MutableMapping):
            clone = copy.copy(elem)
            clone.update(items)
            return clone
        return type(elem)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


def rebuild_sequence(elem: Sequence[Any], items: list[Any]) -> Any:
    """A sequence like ``elem`` holding ``items``; a list when that is not possible."""
    try:
        if isinstance(elem, MutableSequence):
            clone = copy.copy(elem)
            for i, item in enumerate(items):
                clone[i] = item
            return clone
        return type(elem)(items)  # type: ignore[call-arg]
    except TypeError:
        return items
