"""Streaming collate: each sample is written into its row of the batch as it is fetched.

Fetching a whole batch and then stacking it keeps every sample alive until the end: each
fresh array the dataset makes lands on memory the batch before left cold, and the stack
reads it all back. Writing each sample into its row as soon as ``__getitem__`` returns,
and dropping it, hands its memory straight back to the allocator, and the next sample is
made in it while it is still in cache (docs/design.md, "Streaming collate", has the
measurements).

Only arrays and tensors are written row by row: they are what a batch's bytes are. Every
other leaf (numbers, strings, a registered function's type, a container collate cannot
stream) is kept as the column of its values and collated at the end by the very rule
``default_collate`` applies to it, so the batch is the one ``default_collate`` builds.
The plan of a batch (:class:`_Node` tree) is made from its first sample and checked
against every later one (and reused for the next batch while its first sample fits): a
sample that does not fit makes the caller collate the batch as before, from the samples
written so far rebuilt from their rows (:meth:`RowBatch.samples`), never a wrong batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from conveyor import _collate_leaves as _leaves
from conveyor import collate as _collate
from conveyor._collate_errors import Attr
from conveyor._collate_leaves import NATIVE_DTYPES, NP_SCALARS, _out_buffer
from conveyor._collate_registry import Rule

__all__ = ["RowBatch", "RowWriter"]

# Arrays smaller than this are collected and stacked at the end, as before: written one
# row at a time they cost more in Python calls than the cache saves (measured on `tiny`).
STREAM_MIN_BYTES = 16 << 10
_ARRAY_TYPES = (np.ndarray, np.memmap)  # rebuilt from a row as the same type
_LEAF_TYPES = (*NP_SCALARS, float, int, str, bytes)


class _Node:
    """One place in the samples' structure: how a sample's value there is written, rebuilt
    and turned into the batch's value."""

    __slots__ = ()

    def reset(self, batch: RowBatch | None) -> None:
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


class _Column(_Node):
    """A leaf (or a part collate cannot stream) kept as its column of values."""

    __slots__ = ("path", "values")

    def __init__(self, path: tuple[Any, ...]) -> None:
        self.path = path
        self.values: list[Any] = []

    def reset(self, batch: RowBatch | None) -> None:
        self.values = []

    def write(self, row: int, value: Any) -> bool:
        self.values.append(value)
        return True

    def fits(self, value: Any) -> bool:
        return True

    def sample(self, row: int) -> Any:
        return self.values[row]

    def finish(self, rows: int, leaves: Any, rules: Any) -> Any:
        return _collate.collate_column(self.values, self.path, leaves, rules)


class _Rows(_Node):
    """An array or tensor of one dtype and shape in every sample: written into its row."""

    __slots__ = ("_batch", "dtype", "kind", "out", "own", "probe", "shape", "tensor", "tensor_out")

    def __init__(self, example: np.ndarray, kind: Any, tensor: Any = None) -> None:
        self.dtype = example.dtype
        self.shape = example.shape
        self.kind = kind  # the samples' type: np.ndarray, np.memmap or torch.Tensor
        self.tensor = tensor  # the tensors' dtype (torch's rule), else None (the array rule)
        self.out: np.ndarray | None = None  # the batch's memory, on the first write
        self.tensor_out: Any = None  # the same, made by torch (no output allocator)
        self.own = False  # the memory is the batch's own (no output allocator gave it)
        self.probe: Any = None  # what owns the first row's memory (see RowBatch.first_dropped)
        self._batch: RowBatch | None = None  # the batch being written

    def reset(self, batch: RowBatch | None) -> None:
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


class _Dict(_Node):
    __slots__ = ("children", "keys")

    def __init__(self, children: dict[Any, _Node]) -> None:
        self.children = children
        self.keys = frozenset(children)

    def reset(self, batch: RowBatch | None) -> None:
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


class _Sequence(_Node):
    """A tuple (collated into a list, as torch does), a list or a namedtuple."""

    __slots__ = ("children", "kind", "size", "writes")

    def __init__(self, kind: Any, children: list[_Node]) -> None:
        self.kind = kind
        self.children = children
        self.size = len(children)
        self.writes = [child.write for child in children]  # (bound once: once a sample)

    def reset(self, batch: RowBatch | None) -> None:
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


def _plan(elem: Any, path: tuple[Any, ...], leaves: Any, rules: Any) -> _Node:
    """The node for ``elem`` (the first sample's value at ``path``), chosen as collate.py's
    ``_collate`` chooses its rule."""
    if rules is None:
        torch = _leaves.torch
        if torch is not None and isinstance(elem, torch.Tensor):
            return _tensor(elem, path, leaves)
        if isinstance(elem, np.ndarray):
            return _array(elem, path, leaves, None)
        if isinstance(elem, _LEAF_TYPES):
            return _Column(path)
    else:
        action = rules.action(elem)
        if action is Rule.TENSOR:
            return _tensor(elem, path, leaves)
        if action is Rule.ARRAY:
            return _array(elem, path, leaves, rules)
        if action is not None:  # another rule, or a registered function
            return _Column(path)
    kind = type(elem)
    if kind is dict:
        return _Dict(
            {key: _plan(value, (*path, key), leaves, rules) for key, value in elem.items()}
        )
    if kind is tuple or kind is list:
        items = enumerate(elem)
        return _Sequence(kind, [_plan(value, (*path, i), leaves, rules) for i, value in items])
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        names = [Attr(f) for f in elem._fields]
        pairs = zip(elem, names, strict=True)
        return _Sequence(kind, [_plan(value, (*path, n), leaves, rules) for value, n in pairs])
    return _Column(path)  # another container (or an error): collate's own rule at the end


def _array(elem: Any, path: tuple[Any, ...], leaves: Any, rules: Any) -> _Node:
    if rules is not None and rules.tensor_custom and leaves is not _leaves.NUMPY:
        return _Column(path)  # torch's rule makes tensors and looks them up again
    if type(elem) not in _ARRAY_TYPES or elem.dtype not in NATIVE_DTYPES:
        return _Column(path)
    if elem.nbytes < max(STREAM_MIN_BYTES, 1):
        return _Column(path)
    return _Rows(elem, type(elem))


def _tensor(elem: Any, path: tuple[Any, ...], leaves: Any) -> _Node:
    if leaves is _leaves.DEFERRED:
        raise _leaves.NeedsTorch  # the batch is torch's to build, as default_collate does
    torch = _leaves.torch
    if not isinstance(leaves, _leaves.TorchLeaves) or type(elem) is not torch.Tensor:
        return _Column(path)
    if elem.is_nested or elem.layout != torch.strided:
        return _Column(path)
    try:
        example = elem.numpy()
    except Exception:  # grad, another device, conj or neg bits, a dtype NumPy lacks
        return _Column(path)
    if example.dtype not in NATIVE_DTYPES or example.nbytes < max(STREAM_MIN_BYTES, 1):
        return _Column(path)
    return _Rows(example, torch.Tensor, tensor=elem.dtype)


def _numpy(tensor: Any) -> np.ndarray | None:
    """A tensor's memory as an array; None for what torch.stack would treat apart (grad,
    conj or neg bits, another device...)."""
    try:
        return tensor.numpy()
    except Exception:
        return None


def _rows_of(node: _Node) -> list[_Rows]:
    """The leaves ``node`` writes row by row."""
    if isinstance(node, _Dict):
        return [rows for child in node.children.values() for rows in _rows_of(child)]
    if isinstance(node, _Sequence):
        return [rows for child in node.children for rows in _rows_of(child)]
    return [node] if isinstance(node, _Rows) else []


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


class RowBatch:
    """One batch being written: rows so far, the memory it writes into."""

    def __init__(
        self,
        writer: RowWriter,
        size: int,
        collating: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        self.size = size
        self.rows = 0
        self._writer = writer
        self._collating = collating
        self._context: AbstractContextManager[Any] | None = None
        self.plan = writer.plan

    def context(self) -> AbstractContextManager[Any]:
        """Where collate writes (the transport's, entered around each allocation): made at
        the first need, so a batch that fails before takes no memory."""
        if self._context is None:
            self._context = self._collating()
        return self._context

    def write(self, sample: Any) -> bool:
        """Write ``sample`` into the next row; False if it does not fit the plan, or if
        no leaf of the batch is worth writing row by row (see STREAM_MIN_BYTES): the
        batch is then collated as before."""
        row, plan = self.rows, self.plan
        if plan is not None and plan.write(row, sample):
            self.rows = row + 1
            return True
        if row or not self._writer.replan(self, sample):
            return False
        self.rows = 1
        return True

    def first_dropped(self) -> None:
        """The first sample written is garbage now (see :meth:`RowWriter.first_dropped`)."""
        self._writer.first_dropped()

    def samples(self) -> list[Any]:
        """The samples written so far, rebuilt from their rows (for collate as before)."""
        plan = self.plan
        return [] if plan is None else [plan.sample(row) for row in range(self.rows)]

    def finish(self) -> Any:
        """The batch, as the collate function makes it; raises if it cannot (the caller
        then collates :meth:`samples` as before)."""
        return self._writer.finish(self)


class RowWriter:
    """A runner's streaming collate: the plan of the last batch, and its collate function's
    rules (None from :meth:`for_collate` where the function is not a default one)."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn
        self.plan: _Node | None = None
        self._key: Any = None  # the rules collate_fn had when the plan was made
        self._rules: Any = None  # those the plan uses (torch's, for a batch with tensors)
        self.streams = False  # the plan writes some leaf row by row, and it is worth it
        self._rows: list[_Rows] = []  # the plan's leaves written row by row

    @staticmethod
    def for_collate(collate_fn: Callable[[Any], Any]) -> RowWriter | None:
        return RowWriter(collate_fn) if _collate.streams(collate_fn) else None

    def begin(
        self, size: int, collating: Callable[[], AbstractContextManager[Any]]
    ) -> RowBatch | None:
        """A batch of at most ``size`` samples; None when the last batch had no leaf worth
        writing row by row: this one is fetched and collated as before, and its first
        sample goes to :meth:`check`."""
        key = _collate.stream_rules(self.collate_fn)
        if key != self._key:  # registrations changed, or the worker turned to torch
            self.plan, self._key, self._rules, self.streams = None, key, key, False
        plan = self.plan
        if plan is not None and not self.streams:
            return None
        batch = RowBatch(self, size, collating)
        if plan is not None:
            plan.reset(batch)
        return batch

    def check(self, sample: Any) -> None:
        """The first sample of a batch collated as before (see :meth:`begin`): if it does
        not fit the last plan, the next batch makes a new one (it may stream)."""
        plan = self.plan
        if plan is None:
            return
        try:
            fits = plan.fits(sample)
        except Exception:
            fits = False
        if not fits:
            self.plan = None

    def replan(self, batch: RowBatch, sample: Any) -> bool:
        """A plan made from ``sample``, the first of ``batch`` (a new shape, or the first
        batch), and the sample written with it; False if it cannot be."""
        leaves, rules = self._rules = self._key
        try:
            plan = _plan(sample, (), leaves, rules)
        except _leaves.NeedsTorch:  # a tensor in a worker deferring torch
            self._rules = leaves, rules = _collate.stream_rules(self.collate_fn, need_torch=True)
            plan = _plan(sample, (), leaves, rules)
        plan.reset(batch)
        self.plan = batch.plan = plan
        self._rows = _rows_of(plan)
        self.streams = bool(self._rows)
        return self.streams and plan.write(0, sample)

    def first_dropped(self) -> None:
        """The batch's first sample was dropped once written. If none of its arrays went
        with it, the dataset keeps them (rows of a table, images loaded once): writing
        rows one by one saves no memory and costs Python calls, so the next batches are
        collated as before (a batch of another shape tries again)."""
        if not any(rows.probe is not None and rows.probe() is None for rows in self._rows):
            self.streams = False

    def finish(self, batch: RowBatch) -> Any:
        plan = batch.plan
        assert plan is not None and batch.rows, "finish() after a sample was written"
        leaves, rules = self._rules
        with batch.context():  # columns are stacked into the transport's memory too
            try:
                return plan.finish(batch.rows, leaves, rules)
            except _leaves.NeedsTorch:
                # A column only torch can collate, in a worker deferring it: the whole
                # batch becomes torch's (default_collate does the same).
                leaves, rules = _collate.stream_rules(self.collate_fn, need_torch=True)
                return plan.finish(batch.rows, leaves, rules)
