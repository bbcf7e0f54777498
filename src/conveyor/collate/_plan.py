"""The plan of a streamed batch: one node per place in the samples' structure.

The plan is made from a batch's first sample (:func:`make_plan`), choosing at each place the
rule ``_collate_walk.collate_at`` would choose: an array or tensor big enough to be worth
it is written into its row of the batch as each sample comes (:class:`Rows`); every other
leaf, and every container collate cannot stream, is kept as the column of its values
(:class:`Column`) and collated at the end by ``default_collate``'s own rule for it. A
node also says whether a later sample fits (``fits``, ``write``) and rebuilds a written
sample from its row (``sample``), so a batch that stops fitting is collated as before.

What a node needs of the batch it writes into is :class:`BatchMemory`: its size and the
transport's memory to allocate in (``_collate_rows.RowBatch`` is one).
"""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from conveyor.collate import _leaves
from conveyor.collate._errors import Attr
from conveyor.collate._leaves import NATIVE_DTYPES, NP_SCALARS, _out_buffer
from conveyor.collate._registry import Rule
from conveyor.collate._walk import collate_at

__all__ = ["STREAM_MIN_BYTES", "BatchMemory", "Column", "Node", "Rows", "make_plan", "rows_of"]

# Arrays smaller than this are collected and stacked at the end, as before: written one
# row at a time they cost more in Python calls than the cache saves (measured on `tiny`).
STREAM_MIN_BYTES = 16 << 10
_ARRAY_TYPES = (np.ndarray, np.memmap)  # rebuilt from a row as the same type
_LEAF_TYPES = (*NP_SCALARS, float, int, str, bytes)


class BatchMemory(Protocol):
    """The batch a plan writes into, as its nodes see it."""

    size: int  # rows to allocate (the samples the batch may hold)

    def context(self) -> AbstractContextManager[Any]:
        """Where collate writes: entered around each allocation."""
        ...


class Node:
    """One place in the samples' structure: how a sample's value there is written, rebuilt
    and turned into the batch's value."""

    __slots__ = ()

    def reset(self, batch: BatchMemory | None) -> None:
        raise NotImplementedError

    def write(self, row: int, value: Any) -> bool:
        raise NotImplementedError

    def fits(self, value: Any) -> bool:
        """Whether ``value`` would be written (nothing is)."""
        raise NotImplementedError

    def sample(self, row: int) -> Any:
        raise NotImplementedError

    def finish(self, rows: int, leaves: Any, rules: Any) -> Any:
        raise NotImplementedError


class Column(Node):
    """A leaf (or a part collate cannot stream) kept as its column of values."""

    __slots__ = ("path", "values")

    def __init__(self, path: tuple[Any, ...]) -> None:
        self.path = path
        self.values: list[Any] = []

    def reset(self, batch: BatchMemory | None) -> None:
        self.values = []

    def write(self, row: int, value: Any) -> bool:
        self.values.append(value)
        return True

    def fits(self, value: Any) -> bool:
        return True

    def sample(self, row: int) -> Any:
        return self.values[row]

    def finish(self, rows: int, leaves: Any, rules: Any) -> Any:
        return collate_at(self.values, self.path, leaves, rules)


class Rows(Node):
    """An array or tensor of one dtype and shape in every sample: written into its row."""

    __slots__ = ("_batch", "dtype", "kind", "out", "own", "probe", "shape", "tensor", "tensor_out")

    def __init__(self, example: np.ndarray, kind: Any, tensor: Any = None) -> None:
        self.dtype = example.dtype
        self.shape = example.shape
        self.kind = kind  # the samples' type: np.ndarray, np.memmap, torch.Tensor (or a
        # subclass torch stacks into a plain tensor)
        self.tensor = tensor  # the tensors' dtype (torch's rule), else None (the array rule)
        self.out: np.ndarray | None = None  # the batch's memory, on the first write
        self.tensor_out: Any = None  # the same, made by torch (no output allocator)
        self.own = False  # the memory is the batch's own (no output allocator gave it)
        # What owns the first row's memory (see collate._rows.RowWriter.first_dropped).
        self.probe: Any = None
        self._batch: BatchMemory | None = None  # the batch being written

    def reset(self, batch: BatchMemory | None) -> None:
        self._batch, self.out, self.tensor_out, self.probe = batch, None, None, None

    def write(self, row: int, value: Any) -> bool:
        if type(value) is not self.kind:
            return False
        array = value if self.tensor is None else _numpy(value)
        if array is None or array.shape != self.shape:
            return False
        dtype = array.dtype
        if dtype is not self.dtype and dtype != self.dtype:
            return False
        out = self.out
        if out is None:
            out = self._allocate()
            self.probe = _owner(value)
        out[row] = array
        return True

    def fits(self, value: Any) -> bool:
        if type(value) is not self.kind:
            return False
        array = value if self.tensor is None else _numpy(value)
        return array is not None and array.shape == self.shape and array.dtype == self.dtype

    def _allocate(self) -> np.ndarray:
        assert self._batch is not None
        shape = (self._batch.size, *self.shape)
        with self._batch.context():
            out = _out_buffer(shape, self.dtype)  # in the transport's memory, as collate's
        self.own = out is None
        if out is None:
            if self.tensor is not None:
                torch = _leaves.torch
                self.tensor_out = torch.empty(shape, dtype=self.tensor)
                out = self.tensor_out.numpy()
            else:
                out = np.empty(shape, self.dtype)
        self.out = out
        return out

    def sample(self, row: int) -> Any:
        assert self.out is not None
        value = self.out[row, ...]
        if self.tensor is not None:
            return _leaves.torch.from_numpy(value)
        return value if self.kind is np.ndarray else value.view(self.kind)

    def finish(self, rows: int, leaves: Any, rules: Any) -> Any:
        out, made = self.out, self.tensor_out
        assert out is not None, "finish() after a row was written"
        if rows < len(out):
            # Samples were left out: the rows written (copied to memory of their own size
            # where the batch's memory is its own, as a stack would have made it).
            if made is not None:
                return made[:rows].clone()
            out = out[:rows].copy() if self.own else out[:rows]
        if made is not None:
            return made
        if self.tensor is not None or isinstance(leaves, _leaves.TorchLeaves):
            return _leaves.torch.from_numpy(out)
        return out


class _Dict(Node):
    __slots__ = ("children", "keys")

    def __init__(self, children: dict[Any, Node]) -> None:
        self.children = children
        self.keys = frozenset(children)

    def reset(self, batch: BatchMemory | None) -> None:
        for child in self.children.values():
            child.reset(batch)

    def write(self, row: int, value: Any) -> bool:
        if type(value) is not dict or value.keys() != self.keys:
            return False
        for key, child in self.children.items():
            if not child.write(row, value[key]):
                break
        else:
            return True
        return False

    def fits(self, value: Any) -> bool:
        if type(value) is not dict or value.keys() != self.keys:
            return False
        return all(child.fits(value[key]) for key, child in self.children.items())

    def sample(self, row: int) -> Any:
        return {key: child.sample(row) for key, child in self.children.items()}

    def finish(self, rows: int, leaves: Any, rules: Any) -> Any:
        return {key: child.finish(rows, leaves, rules) for key, child in self.children.items()}


class _Sequence(Node):
    """A tuple (collated into a list, as torch does), a list or a namedtuple."""

    __slots__ = ("children", "kind", "size", "writes")

    def __init__(self, kind: Any, children: list[Node]) -> None:
        self.kind = kind
        self.children = children
        self.size = len(children)
        self.writes = [child.write for child in children]  # (bound once: once a sample)

    def reset(self, batch: BatchMemory | None) -> None:
        for child in self.children:
            child.reset(batch)

    def write(self, row: int, value: Any) -> bool:
        if type(value) is not self.kind or len(value) != self.size:
            return False
        for write, item in zip(self.writes, value):  # noqa: B905 (lengths checked)
            if not write(row, item):
                break
        else:
            return True
        return False

    def fits(self, value: Any) -> bool:
        if type(value) is not self.kind or len(value) != len(self.children):
            return False
        return all(child.fits(item) for child, item in zip(self.children, value, strict=True))

    def sample(self, row: int) -> Any:
        items = [child.sample(row) for child in self.children]
        if self.kind is list:
            return items
        return tuple(items) if self.kind is tuple else self.kind(*items)

    def finish(self, rows: int, leaves: Any, rules: Any) -> Any:
        items = [child.finish(rows, leaves, rules) for child in self.children]
        return self.kind(*items) if self.kind not in (tuple, list) else items


def make_plan(elem: Any, path: tuple[Any, ...], leaves: Any, rules: Any) -> Node:
    """The node for ``elem`` (the first sample's value at ``path``), chosen as
    ``collate_at`` chooses its rule."""
    if rules is None:
        torch = _leaves.torch
        if torch is not None and isinstance(elem, torch.Tensor):
            return _tensor(elem, path, leaves)
        if isinstance(elem, np.ndarray):
            return _array(elem, path, leaves, None)
        if isinstance(elem, _LEAF_TYPES):
            return Column(path)
    else:
        action = rules.action(elem)
        if action is Rule.TENSOR:
            return _tensor(elem, path, leaves)
        if action is Rule.ARRAY:
            return _array(elem, path, leaves, rules)
        if action is not None:  # another rule, or a registered function
            return Column(path)
    kind = type(elem)
    if kind is dict:
        return _Dict(
            {key: make_plan(value, (*path, key), leaves, rules) for key, value in elem.items()}
        )
    if kind is tuple or kind is list:
        items = enumerate(elem)
        return _Sequence(kind, [make_plan(value, (*path, i), leaves, rules) for i, value in items])
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        names = [Attr(f) for f in elem._fields]
        pairs = zip(elem, names, strict=True)
        return _Sequence(kind, [make_plan(value, (*path, n), leaves, rules) for value, n in pairs])
    return Column(path)  # another container (or an error): collate's own rule at the end


def _array(elem: Any, path: tuple[Any, ...], leaves: Any, rules: Any) -> Node:
    if rules is not None and rules.tensor_custom and leaves is not _leaves.NUMPY:
        return Column(path)  # torch's rule makes tensors and looks them up again
    if type(elem) not in _ARRAY_TYPES or elem.dtype not in NATIVE_DTYPES:
        return Column(path)
    if elem.nbytes < max(STREAM_MIN_BYTES, 1):
        return Column(path)
    return Rows(elem, type(elem))


def _tensor(elem: Any, path: tuple[Any, ...], leaves: Any) -> Node:
    if leaves is _leaves.DEFERRED:
        raise _leaves.NeedsTorch  # the batch is torch's to build, as default_collate does
    torch = _leaves.torch
    if not isinstance(leaves, _leaves.TorchLeaves):
        return Column(path)
    try:
        if elem.is_nested or elem.layout != torch.strided:
            return Column(path)
        example = elem.numpy()
    except Exception:  # grad, another device, conj or neg bits, a dtype NumPy lacks (or a
        return Column(path)  # subclass of Tensor whose own rules refuse)
    if example.dtype not in NATIVE_DTYPES or example.nbytes < max(STREAM_MIN_BYTES, 1):
        return Column(path)
    if type(elem) is not torch.Tensor and not _stacks_plain(elem):
        return Column(path)
    return Rows(example, type(elem), tensor=elem.dtype)


def _stacks_plain(elem: Any) -> bool:
    """Whether torch stacks this subclass of Tensor into a plain tensor of its values, as
    ``default_collate`` then makes of it (torchvision's ``tv_tensors.Image``, what its v2
    transforms return, does): its rows may be written as a plain tensor's. A subclass
    that keeps its type, or changes its values, through ``torch.stack`` is collated as
    before. Asked once a plan (two samples' worth of memory, once)."""
    torch = _leaves.torch
    try:
        stacked = torch.stack([elem, elem])
        return type(stacked) is torch.Tensor and bool(
            torch.equal(stacked[1], elem.as_subclass(torch.Tensor))
        )
    except Exception:  # a subclass torch cannot stack, or compare: as before
        return False


def _numpy(tensor: Any) -> np.ndarray | None:
    """A tensor's memory as an array; None for what torch.stack would treat apart (grad,
    conj or neg bits, another device...)."""
    try:
        return tensor.numpy()
    except Exception:
        return None


def rows_of(node: Node) -> list[Rows]:
    """The leaves ``node`` writes row by row."""
    if isinstance(node, _Dict):
        return [rows for child in node.children.values() for rows in rows_of(child)]
    if isinstance(node, _Sequence):
        return [rows for child in node.children for rows in rows_of(child)]
    return [node] if isinstance(node, Rows) else []


def _owner(value: Any) -> Any:
    """A weak reference to what owns ``value``'s memory (the array or tensor it views, if
    it is a view), or None where there can be none."""
    owner = value
    if isinstance(value, np.ndarray):
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
    else:  # a tensor
        while owner._base is not None:
            owner = owner._base
    try:
        return weakref.ref(owner)
    except TypeError:
        return None
