"""How collate turns a batch of leaves into one array or tensor.

:class:`TorchLeaves` builds exactly what torch's default functions build;
:class:`NumpyLeaves` builds NumPy arrays (no torch, or ``numpy_collate``);
:class:`DeferredLeaves`, in a worker that leaves tensors to the main process,
builds NumPy where that is provably torch's result and raises
:class:`NeedsTorch` anywhere else. Stacked arrays are written into the memory
:data:`OUTPUT_ALLOCATOR` supplies, when set. ``collate.py`` walks the batch's
structure and picks the rule; the rules live here.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conveyor.collate import _errors as _err

torch: Any = None  # set by adopt(): tensors exist only once torch is loaded

Allocator = Callable[[int], np.ndarray | None]

OUTPUT_ALLOCATOR: contextvars.ContextVar[Allocator | None] = contextvars.ContextVar(
    "conveyor_collate_output_allocator", default=None
)
"""When set, ``allocator(nbytes)`` returns a writable 1-d uint8 array of at least
``nbytes`` bytes (or None) that a stacked array or tensor is written into."""

NP_SCALARS = (np.bool_, np.number, np.object_)
NATIVE_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)  # fmt: skip
_TORCH_TO_NP: dict[Any, np.dtype[Any]] = {}
_SPARSE: frozenset[Any] = frozenset()


def adopt(module: Any) -> TorchLeaves:
    """torch is loaded: the leaf rules that build its tensors."""
    global torch, _TORCH_TO_NP, _SPARSE
    torch = module
    _TORCH_TO_NP = {torch.from_numpy(np.zeros(0, d)).dtype: d for d in NATIVE_DTYPES}
    _SPARSE = frozenset(
        (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
    )
    return TorchLeaves()


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


class NumpyLeaves:
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


class TorchLeaves:
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
        if elem.dtype in NATIVE_DTYPES:
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


class NeedsTorch(Exception):
    """Only torch itself can say what this batch collates to."""


class DeferredLeaves(NumpyLeaves):
    """In a worker: NumPy, where that is exactly torch (see _collate_walk.make_tensors_in_main).

    Each rule here gives the values, dtype and shape torch's would (the main
    process turns the arrays into tensors as it unpickles them). Anything
    else (mixed dtypes or types, ragged shapes, errors) raises NeedsTorch,
    and the batch is collated again with torch's own rules.
    """

    def tensor(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        raise NeedsTorch  # samples holding tensors: torch's own rules

    def array(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        stacked = _stack_exact(batch) if batch[0].dtype in NATIVE_DTYPES else None
        if stacked is None:
            raise NeedsTorch
        return stacked

    def scalar(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        if len(set(map(type, batch))) != 1:
            raise NeedsTorch
        out = np.array(batch)
        if out.dtype not in NATIVE_DTYPES or out.ndim != 1:
            raise NeedsTorch
        return out

    def float_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        try:
            out = np.array(batch, dtype=np.float64)  # torch.tensor(batch, dtype=float64)
        except Exception as exc:
            raise NeedsTorch from exc
        if out.ndim != 1:
            raise NeedsTorch
        return out

    def int_(self, batch: Sequence[Any], path: tuple[Any, ...]) -> Any:
        try:
            out = np.array(batch)
        except Exception as exc:
            raise NeedsTorch from exc
        # int64 (ints, maybe with bools) and bool (all bools) are torch's dtypes too.
        if out.ndim != 1 or out.dtype not in (np.dtype(np.int64), np.dtype(np.bool_)):
            raise NeedsTorch
        return out


Leaves = NumpyLeaves | TorchLeaves
NUMPY = NumpyLeaves()
DEFERRED = DeferredLeaves()
