"""Batch samples: ``default_collate`` / ``default_convert`` as torch builds them.

With torch installed, the results are those of ``torch.utils.data.default_collate``
and ``default_convert``; without it, leaves become NumPy arrays, as
:func:`numpy_collate` always makes them. When collation fails, the error names
the field path, the dataset indices (see :func:`collate_context`), the shapes,
types or key sets involved, and the fix. It is a :class:`CollateError` that is
also the built-in type torch raises for the same mistake.

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
are written into, so they can travel without another copy.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import math
import sys
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

import numpy as np

from conveyor import _collate_errors as _err
from conveyor import _scope, _torch
from conveyor._collate_errors import collate_context
from conveyor._collate_registry import Call, CollateFnMap, Dispatch, Registrations, Registries, Rule

torch: Any = _torch.load()  # None without torch, or in a worker that defers it

__all__ = [
    "OUTPUT_ALLOCATOR",
    "Allocator",
    "collate",
    "collate_context",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "numpy_collate",
]

Allocator = Callable[[int], np.ndarray | None]

OUTPUT_ALLOCATOR: contextvars.ContextVar[Allocator | None] = contextvars.ContextVar(
    "conveyor_collate_output_allocator", default=None
)
"""When set, ``allocator(nbytes)`` returns a writable 1-d uint8 array of at least
``nbytes`` bytes (or None) that a stacked array or tensor is written into."""

_NP_SCALARS = (np.bool_, np.number, np.object_)
_NATIVE_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)  # fmt: skip
_TORCH_TO_NP: dict[Any, np.dtype[Any]] = {}
_SPARSE: frozenset[Any] = frozenset()


def _adopt_torch() -> Any:
    """Switch this module to torch (imported now if need be); returns the leaf rules."""
    global torch, _TORCH_TO_NP, _SPARSE, _DEFAULT
    torch = _torch.require()
    if torch is None:
        return _NUMPY
    _TORCH_TO_NP = {torch.from_numpy(np.zeros(0, d)).dtype: d for d in _NATIVE_DTYPES}
    _SPARSE = frozenset(
        (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
    )
    _DEFAULT = _TorchLeaves()
    _registry.adopt_torch(torch)
    return _DEFAULT


def _out_buffer(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
    """An array of ``shape`` and ``dtype`` on memory from the allocator, if any."""
    allocate = OUTPUT_ALLOCATOR.get()
    nbytes = math.prod(shape) * dtype.itemsize
    if allocate is None or nbytes == 0:
        return None
    buffer = allocate(nbytes)
    if buffer is None:
        return None
    if not (
        isinstance(buffer, np.ndarray)
        and buffer.dtype == np.uint8
        and buffer.ndim == 1
        and buffer.flags.c_contiguous
        and buffer.flags.writeable
        and buffer.size >= nbytes
    ):
        raise ValueError(
            "OUTPUT_ALLOCATOR must return a writable, contiguous 1-d uint8 numpy array of at "
            f"least {nbytes} bytes, or None; it returned {_err.type_name(type(buffer))}"
            f"{getattr(buffer, 'shape', '')}."
        )
    if buffer.ctypes.data % dtype.itemsize:
        return None
    return buffer[:nbytes].view(dtype).reshape(shape)


def _same_arrays(batch: Sequence[Any], dtype: Any, shape: Any, kind: Any) -> bool:
    return all(type(x) is kind and x.dtype == dtype and x.shape == shape for x in batch)


def _stack_exact(batch: Sequence[Any]) -> np.ndarray | None:
    """Stack arrays that all share the first one's dtype and shape, else None.

    Optimistic: ``casting="no"`` makes NumPy itself refuse any other dtype or
    shape, so the happy path has no Python-level loop over the batch.
    """
    elem = batch[0]
    if not isinstance(elem, np.ndarray):
        return None
    shape = (len(batch), *elem.shape)
    out = _out_buffer(shape, elem.dtype)
    if out is None:
        out = np.empty(shape, elem.dtype)
    try:
        if elem.ndim:
            # Joining along axis 0 into the (n * d0, ...) view of ``out`` is a
            # stack, without the per-element views np.stack builds (4x faster).
            # NumPy checks every dimension but the first; ragged first dimensions
            # could add up to the right total, so those are checked here (len() is
            # a third of the cost of comparing whole shapes).
            if len(set(map(len, batch))) != 1:
                return None
            np.concatenate(batch, out=out.reshape(-1, *elem.shape[1:]), casting="no")
        else:
            np.stack(batch, out=out, casting="no")  # checks every shape itself
    except (ValueError, TypeError, AttributeError):
        return None
    return out


def _np_stack(batch: Sequence[Any], path: tuple[Any, ...]) -> np.ndarray:
    stacked = _stack_exact(batch)
    if stacked is not None:
        return stacked
    try:
        return np.stack(batch)  # mixed dtypes promote; mixed shapes raise and get explained
    except Exception as exc:
        _err.raise_leaf(batch, path, exc)


class _NumpyLeaves:
    """Leaves become NumPy arrays."""

    def tensor(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        try:
            arrays = [t.numpy(force=True) if isinstance(t, torch.Tensor) else t for t in batch]
        except Exception as exc:
            _err.raise_leaf(batch, path, exc)
        return _np_stack(arrays, path)

    def array(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        if batch[0].dtype.kind in "SUO":
            _err.raise_unsupported(batch, path, batch[0].dtype)
        return _np_stack(batch, path)

    def scalar(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        return self._numbers(batch, path, None)

    def float_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        return self._numbers(batch, path, np.float64)

    def int_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        out = self._numbers(batch, path, None)
        return out.astype(np.int64, copy=False) if out.dtype.kind == "i" else out

    def _numbers(self, batch: Sequence[Any], path: tuple[Any, ...], dtype: Any) -> np.ndarray:
        try:
            out = np.array(batch, dtype=dtype)
            if out.dtype.kind == "O" or out.ndim != 1:
                raise TypeError(f"these values make a numpy array of dtype {out.dtype}")
        except Exception as exc:
            _err.raise_leaf(batch, path, exc)
        return out


class _TorchLeaves:
    """Leaves become tensors exactly as torch's default_collate makes them."""

    def tensor(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        elem = batch[0]
        if elem.is_nested:
            _err.raise_tensor_layout(batch, path, "nested")
        if elem.layout in _SPARSE:
            _err.raise_tensor_layout(batch, path, "sparse")
        out = None
        dtype = _TORCH_TO_NP.get(elem.dtype)
        if (
            dtype is not None
            and OUTPUT_ALLOCATOR.get() is not None
            and elem.device.type == "cpu"
            and all(
                type(t) is type(elem) and t.device == elem.device and not t.requires_grad
                for t in batch
            )
            and _same_arrays(batch, elem.dtype, elem.shape, type(elem))
        ):
            view = _out_buffer((len(batch), *elem.shape), dtype)
            out = None if view is None else torch.from_numpy(view)
        try:
            return torch.stack(batch, 0, out=out)
        except Exception as exc:
            _err.raise_leaf(batch, path, exc)

    def array(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        elem = batch[0]
        if elem.dtype.kind in "SUO":
            _err.raise_unsupported(batch, path, elem.dtype)
        if elem.dtype in _NATIVE_DTYPES:
            stacked = _stack_exact(batch)
            if stacked is not None:
                return torch.from_numpy(stacked)
        try:
            tensors = [torch.as_tensor(a) for a in batch]
        except Exception as exc:
            _err.raise_leaf(batch, path, exc)
        return self.tensor(tensors, path)

    def scalar(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        try:
            return torch.as_tensor(batch)
        except Exception as exc:
            _err.raise_leaf(batch, path, exc)

    def float_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        try:
            return torch.tensor(batch, dtype=torch.float64)
        except Exception as exc:
            _err.raise_leaf(batch, path, exc)

    def int_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        if type(batch[0]) is int:
            # Through NumPy is several times faster for a list of plain ints; it
            # gives int64 exactly when torch.tensor(batch) would.
            with contextlib.suppress(OverflowError, ValueError, TypeError):
                ints = np.array(batch)
                if ints.dtype == np.int64 and ints.ndim == 1:
                    return torch.from_numpy(ints)
        try:
            return torch.tensor(batch)
        except Exception as exc:
            _err.raise_leaf(batch, path, exc)


class _NeedsTorch(Exception):
    """Only torch itself can say what this batch collates to."""


class _DeferredLeaves(_NumpyLeaves):
    """In a worker: NumPy, where that is exactly torch (see make_tensors_in_main).

    Each rule here gives the values, dtype and shape torch's would (the main
    process turns the arrays into tensors as it unpickles them). Anything
    else (mixed dtypes or types, ragged shapes, errors) raises _NeedsTorch,
    and the batch is collated again with torch's own rules.
    """

    def tensor(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        raise _NeedsTorch  # samples holding tensors: torch's own rules

    def array(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        stacked = _stack_exact(batch) if batch[0].dtype in _NATIVE_DTYPES else None
        if stacked is None:
            raise _NeedsTorch
        return stacked

    def scalar(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        if len(set(map(type, batch))) != 1:
            raise _NeedsTorch
        out = np.array(batch)
        if out.dtype not in _NATIVE_DTYPES or out.ndim != 1:
            raise _NeedsTorch
        return out

    def float_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        try:
            out = np.array(batch, dtype=np.float64)  # torch.tensor(batch, dtype=float64)
        except Exception as exc:
            raise _NeedsTorch from exc
        if out.ndim != 1:
            raise _NeedsTorch
        return out

    def int_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        try:
            out = np.array(batch)
        except Exception as exc:
            raise _NeedsTorch from exc
        # int64 (ints, maybe with bools) and bool (all bools) are torch's dtypes too.
        if out.ndim != 1 or out.dtype not in (np.dtype(np.int64), np.dtype(np.bool_)):
            raise _NeedsTorch
        return out


_Leaves = _NumpyLeaves | _TorchLeaves
_NUMPY = _NumpyLeaves()
_DEFERRED = _DeferredLeaves()
_DEFAULT: _Leaves = _NUMPY


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


def _tensors_in_main() -> bool:
    scope = _scope.current()
    return scope is not None and scope.tensors_in_main


def _default_leaves() -> _Leaves:
    if torch is None and "torch" in sys.modules:
        _adopt_torch()  # the user's code imported torch: recognise its tensors
    if _tensors_in_main():
        return _DEFERRED
    if torch is None:
        # Called from a user's own collate_fn in a worker deferring torch: the
        # main process will not convert, so torch's tensors are needed here.
        return _adopt_torch()
    return _DEFAULT


def _collate(
    batch: Sequence[Any], path: tuple[Any, ...], leaves: _Leaves, rules: Dispatch | None
) -> Any:
    """Collate ``batch`` at ``path``; ``rules``: the registries' lookup, None when
    they hold only the defaults (the built-in rules below give the same result)."""
    elem = batch[0]
    if rules is None:
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
            return _call(action, batch, path, leaves)
        if action is not None:
            return _by_rule(action, batch, path, leaves, rules)
    if isinstance(elem, Mapping):
        out: dict[Any, Any] = {}
        for key in elem:
            try:
                column = [d[key] for d in batch]
            except Exception as exc:
                _err.raise_gather(batch, path, key, exc)
            out[key] = _collate(column, (*path, key), leaves, rules)
        return _rebuild_mapping(elem, out)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        try:
            columns = list(zip(*batch, strict=False))
        except Exception as exc:
            _err.raise_not_sequence(batch, path, exc)
        names = [_err.Attr(f) for f in elem._fields]
        return type(elem)(
            *(_collate(c, (*path, n), leaves, rules) for c, n in zip(columns, names, strict=True))
        )
    if isinstance(elem, Sequence):
        try:
            columns = list(zip(*batch, strict=True))
        except ValueError:
            _err.raise_lengths(batch, path)
        except TypeError as exc:
            _err.raise_not_sequence(batch, path, exc)
        items = [_collate(c, (*path, i), leaves, rules) for i, c in enumerate(columns)]
        return items if isinstance(elem, tuple) else _rebuild_sequence(elem, items)
    _err.raise_unsupported(batch, path)


def _by_rule(
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
                tensors = [torch.as_tensor(a) for a in batch]
            except Exception as exc:
                _err.raise_leaf(batch, path, exc)
            return _collate(tensors, path, leaves, rules)
        return leaves.array(batch, path)
    if rule is Rule.SCALAR:
        return leaves.scalar(batch, path)
    if rule is Rule.FLOAT:
        return leaves.float_(batch, path)
    if rule is Rule.INT:
        return leaves.int_(batch, path)
    return batch  # Rule.STR


def _call(call: Call, batch: Sequence[Any], path: tuple[Any, ...], leaves: _Leaves) -> Any:
    """A registered function, run where torch runs it: here, on the samples."""
    if leaves is _DEFERRED:
        raise _NeedsTorch  # what it returns must reach the main process as it is
    if _tensors_in_main():
        # A worker that defers torch: from now on it builds torch's batches itself,
        # and the transport sends NumPy arrays as arrays (see _workers/core.py).
        make_tensors_in_main(False)
    try:
        return call.fn(batch, collate_fn_map=call.collate_fn_map)
    except Exception as exc:
        _err.raise_registered(exc, call.fn, call.key, path, len(batch))


def _rebuild_mapping(elem: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping like ``elem`` holding ``items``; a dict when that is not possible."""
    try:
        if isinstance(elem, MutableMapping):
            clone = copy.copy(elem)
            clone.update(items)
            return clone
        return type(elem)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


def _rebuild_sequence(elem: Sequence[Any], items: list[Any]) -> Any:
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
            return _collate(batch, (), leaves, rules)
        except _NeedsTorch:
            leaves = _adopt_torch() if torch is None else _DEFAULT
            rules = _registry.both()  # with torch's map, now that torch is loaded
    return _collate(batch, (), leaves, rules)


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
    return _collate(batch, (), _NUMPY, _registry.own_only())


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
    return _collate(batch, (), _exact_leaves(), _registry.given(collate_fn_map))


def _exact_leaves() -> _Leaves:
    """The leaves of a batch finished here (never deferred to the main process)."""
    leaves = _default_leaves()
    if leaves is _DEFERRED:
        return _adopt_torch() if torch is None else _DEFAULT
    return leaves


def _default_rule(rule: Rule, batch: Sequence[Any], collate_fn_map: Any) -> Any:
    rules = None if collate_fn_map is None else _registry.given(collate_fn_map)
    return _by_rule(rule, batch, (), _exact_leaves(), rules)


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
    if torch is None and not _tensors_in_main():
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
        return _rebuild_mapping(data, {k: default_convert(data[k]) for k in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data


if torch is not None:
    _adopt_torch()
