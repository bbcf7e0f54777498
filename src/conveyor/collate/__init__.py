"""Batch samples: ``default_collate`` / ``default_convert`` as torch builds them.

With torch installed, the results are those of ``torch.utils.data.default_collate``
and ``default_convert``; without it, leaves become NumPy arrays, as
:func:`numpy_collate` always makes them. When collation fails, the error names
the field path, the dataset indices (see :func:`collate_context`), the shapes,
types or key sets involved, and the fix. It is a :class:`~conveyor.errors.CollateError`
that is also the built-in type torch raises for the same mistake.

A collate function registered for a type is honoured before the built-in rules,
as torch's ``collate`` honours it: in torch's
``torch.utils.data._utils.collate.default_collate_fn_map`` (when torch is
installed) and in conveyor's own :data:`default_collate_fn_map`, which works
without torch too. An element's type is looked up exactly, then with
``isinstance`` against each key in insertion order, in torch's map with
conveyor's entries laid over it (a type in both: conveyor's function). The
function is called as ``fn(batch, collate_fn_map=...)``: torch's functions get
torch's map, conveyor's the merged one, and :func:`collate` recurses with it.
Workers get the main process's maps as they were at ``iter()``, so a
registration made in ``__main__`` or a notebook reaches spawn and forkserver
workers too. See docs/design.md, "Collate registries".

:data:`OUTPUT_ALLOCATOR` lets a transport supply the memory that stacked arrays
are written into, so they can travel without another copy; :func:`empty` and
:func:`zeros` give a collate function of the user's own arrays in that memory.

This module chooses how a batch is collated here and now: torch's leaf rules or NumPy's
(or NumPy's, deferring tensors to the main process, in a worker), and which registries
apply. The walk itself, each element to its rule, is ``collate/_walk.py``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conveyor import _torch
from conveyor.collate import _leaves, _walk
from conveyor.collate._errors import collate_context
from conveyor.collate._leaves import DEFERRED as _DEFERRED
from conveyor.collate._leaves import NP_SCALARS as _NP_SCALARS
from conveyor.collate._leaves import NUMPY as _NUMPY
from conveyor.collate._leaves import OUTPUT_ALLOCATOR, Allocator
from conveyor.collate._leaves import Leaves as _Leaves
from conveyor.collate._leaves import NeedsTorch as _NeedsTorch
from conveyor.collate._output import empty, zeros
from conveyor.collate._registry import CollateFnMap, Dispatch, Registrations, Registries, Rule

# The walk's own switch, set for a worker core's scope; importable from here as before.
from conveyor.collate._walk import make_tensors_in_main as make_tensors_in_main

torch: Any = _torch.load()  # None without torch, or in a worker that defers it

__all__ = [
    "OUTPUT_ALLOCATOR",
    "Allocator",
    "collate",
    "collate_context",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "empty",
    "numpy_collate",
    "zeros",
]


def _adopt_torch() -> Any:
    """Switch this module to torch (imported now if need be); returns the leaf rules."""
    global torch, _DEFAULT
    module = _torch.require()
    if module is None:
        return _NUMPY
    _DEFAULT = _leaves.adopt(module)
    torch = module
    _registry.adopt_torch(torch)
    return _DEFAULT


_DEFAULT: _Leaves = _NUMPY


def _default_leaves() -> _Leaves:
    if torch is None and "torch" in sys.modules:
        _adopt_torch()  # the user's code imported torch: recognise its tensors
    if _walk.tensors_in_main():
        return _DEFERRED
    if torch is None:
        # Called from a user's own collate_fn in a worker deferring torch: the
        # main process will not convert, so torch's tensors are needed here.
        return _adopt_torch()
    return _DEFAULT


def _first(batch: Sequence[Any]) -> None:
    try:
        batch[0]
    except IndexError:
        raise IndexError(
            "default_collate got an empty batch: the batch sampler yielded no indices, or a "
            "collate_fn was called with []; give each batch at least one sample."
        ) from None


def default_collate(batch: Sequence[Any]) -> Any:
    """Stack a list of samples into a batch, as ``torch.utils.data.default_collate``.

    Tensors, NumPy arrays and numbers become tensors with a leading batch
    dimension (NumPy arrays when torch is not installed); strings and bytes
    stay a list; mappings, namedtuples and sequences are collated field by
    field (tuples become lists, like torch). A function registered for an
    element's type (in torch's ``default_collate_fn_map`` or in
    :data:`default_collate_fn_map`) collates it instead, as in torch. Wrap the
    call in :func:`collate_context` to have errors name dataset indices.
    """
    _first(batch)
    leaves = _default_leaves()
    rules = _registry.both()
    if leaves is _DEFERRED:
        try:
            return _walk.collate_at(batch, (), leaves, rules)
        except _NeedsTorch:
            leaves = _adopt_torch() if torch is None else _DEFAULT
            rules = _registry.both()  # with torch's map, now that torch is loaded
    return _walk.collate_at(batch, (), leaves, rules)


def numpy_collate(batch: Sequence[Any]) -> Any:
    """Like :func:`default_collate`, but every leaf becomes a NumPy array, never a tensor.

    Python ints become int64 arrays, floats float64, bools bool; NumPy scalars
    keep their dtype; tensors are converted with ``Tensor.numpy(force=True)``.
    Functions registered in :data:`default_collate_fn_map` are honoured; torch's
    map is not consulted (its functions make tensors).
    """
    _first(batch)
    if torch is None and "torch" in sys.modules:
        _adopt_torch()  # the user's code imported torch: recognise its tensors
    return _walk.collate_at(batch, (), _NUMPY, _registry.own_only())


def collate(batch: Sequence[Any], *, collate_fn_map: Mapping[Any, Any] | None = None) -> Any:
    """torch's ``collate``: look each element's type up in ``collate_fn_map``, else
    recurse into mappings, namedtuples and sequences.

    The lookup is torch's: the exact type first, then ``isinstance`` against each
    key in insertion order; ``fn(batch, collate_fn_map=collate_fn_map)`` is called.
    A registered function calls this to collate what its type holds, passing on
    the map it was given. Without a map, a leaf (a number, an array) is an error,
    as in torch. Default functions (torch's or this module's) apply conveyor's
    built-in rule for their type: tensors, or NumPy arrays without torch.
    """
    _first(batch)
    return _walk.collate_at(batch, (), _exact_leaves(), _registry.given(collate_fn_map))


def _exact_leaves() -> _Leaves:
    """The leaves of a batch finished here (never deferred to the main process)."""
    leaves = _default_leaves()
    if leaves is _DEFERRED:
        return _adopt_torch() if torch is None else _DEFAULT
    return leaves


# --- what streaming collate (collate/_rows.py) asks ----------------------------------


def streams(collate_fn: Any) -> bool:
    """Whether ``collate_fn`` is a default collate: this module's ``default_collate`` or
    ``numpy_collate``, or torch's ``default_collate``, whose rules are ours."""
    return (
        collate_fn is default_collate
        or collate_fn is numpy_collate
        or (collate_fn is getattr(sys.modules.get(_TORCH_COLLATE), "default_collate", None))
    )


_TORCH_COLLATE = "torch.utils.data._utils.collate"


def stream_rules(collate_fn: Any, *, need_torch: bool = False) -> tuple[_Leaves, Dispatch | None]:
    """The leaf rules and the registries' lookup ``collate_fn`` collates a batch with now;
    ``need_torch``: those it turns to when a worker deferring torch meets what only torch can
    collate (``default_collate``'s ``_NeedsTorch``)."""
    if collate_fn is numpy_collate:
        if torch is None and "torch" in sys.modules:
            _adopt_torch()  # recognise the user's tensors, as numpy_collate does
        return _NUMPY, _registry.own_only()
    if collate_fn is default_collate:
        leaves = _exact_leaves() if need_torch else _default_leaves()
        return leaves, _registry.both()
    torch_map = sys.modules[_TORCH_COLLATE].default_collate_fn_map
    return _exact_leaves(), _registry.given(torch_map)


def _default_rule(rule: Rule, batch: Sequence[Any], collate_fn_map: Any) -> Any:
    rules = None if collate_fn_map is None else _registry.given(collate_fn_map)
    return _walk.by_rule(rule, batch, (), _exact_leaves(), rules)


# The default entries of conveyor's map, named and called like torch's.


def collate_tensor_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Stack tensors along a new first dimension (torch's ``collate_tensor_fn``)."""
    return _default_rule(Rule.TENSOR, batch, collate_fn_map)


def collate_numpy_array_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Stack NumPy arrays: a tensor (an array without torch)."""
    return _default_rule(Rule.ARRAY, batch, collate_fn_map)


def collate_numpy_scalar_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """NumPy scalars to a tensor of their dtype (an array without torch)."""
    return _default_rule(Rule.SCALAR, batch, collate_fn_map)


def collate_float_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python floats to a float64 tensor (an array without torch)."""
    return _default_rule(Rule.FLOAT, batch, collate_fn_map)


def collate_int_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python ints to an int64 tensor (bools: bool; an array without torch)."""
    return _default_rule(Rule.INT, batch, collate_fn_map)


def collate_str_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Strings and bytes stay the list they came in."""
    return batch


default_collate_fn_map: CollateFnMap = {
    np.ndarray: collate_numpy_array_fn,
    _NP_SCALARS: collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}
"""conveyor's collate registry: ``{type or tuple of types: fn(batch, *, collate_fn_map)}``,
torch's ``default_collate_fn_map`` for conveyor, with or without torch. Add an entry
to have :func:`default_collate` (and :func:`numpy_collate`) collate a type your way;
with torch installed, ``torch.Tensor`` is its first key, and an entry here wins over
one for the same type in torch's map."""

_registry = Registries(default_collate_fn_map, collate_tensor_fn)


def registrations() -> Registrations | None:
    """Both registries as they are now, for workers (None: only the defaults)."""
    return _registry.snapshot()


def carry_in(registrations: Registrations) -> None:
    """In a worker: make both registries what they were in the main process."""
    _registry.carry_in(registrations)


def default_convert(data: Any) -> Any:
    """Turn each NumPy array or scalar inside ``data`` into a tensor, as torch does.

    Without torch installed, leaves are returned as they are (so does a worker
    that defers torch: the main process makes the tensors as it unpickles).
    """
    if torch is None and not _walk.tensors_in_main():
        _adopt_torch()
    if torch is not None:
        if isinstance(data, torch.Tensor):
            return data
        kind = type(data)
        if kind.__module__ == "numpy" and kind.__name__ not in ("str_", "string_"):
            if isinstance(data, np.ndarray) and data.dtype.kind in "SUO":
                return data
            return torch.as_tensor(data)
    if isinstance(data, Mapping):
        return _walk.rebuild_mapping(data, {k: default_convert(data[k]) for k in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _walk.rebuild_sequence(data, [default_convert(d) for d in data])
    return data


if torch is not None:
    _adopt_torch()
