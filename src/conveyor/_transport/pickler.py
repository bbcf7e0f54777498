"""The batch pickler: protocol 5 with the arrays out of band, CPU tensors as their
storage's bytes, NumPy leaves that stand for tensors made tensors again in the main
process, and classes the main process sent by value going back as its own."""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .main_classes import reduce_sent_class

__all__ = ["dumps"]


class _BatchPickler(pickle.Pickler):
    """Pickles CPU tensors as their storage's bytes (out of band) plus their view.

    Sending the storage rather than the tensor keeps shapes, strides and
    offsets exactly, keeps tensors that share a storage sharing it (one
    array per storage, deduplicated by pickle's memo), and works for every
    dtype, NumPy-representable or not. A class the main process sent by value
    (its ``__main__``'s) goes back as a reference to its own (see .main_classes).
    """

    def __init__(self, *args: Any, arrays_as_tensors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._storages: dict[tuple[int, int], np.ndarray] = {}
        self._carriers: set[int] = set()  # ids of the arrays in _storages
        self._arrays_as_tensors = arrays_as_tensors
        # Looked up per batch: a worker may import torch at any time.
        self._torch = sys.modules.get("torch")

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if self._torch is not None and kind is self._torch.Tensor:
            return self._reduce_tensor(obj, self._torch)
        if self._arrays_as_tensors and (kind is np.ndarray or isinstance(obj, np.generic)):
            if id(obj) in self._carriers:
                return NotImplemented  # a tensor's storage bytes, not a leaf
            return _reduce_array_as_tensor(obj)
        if issubclass(kind, type):  # a class (kind is its metaclass)
            return reduce_sent_class(obj) or NotImplemented
        return NotImplemented

    def _reduce_tensor(self, t: Any, torch: Any) -> Any:
        if t.device.type != "cpu" or t.layout != torch.strided or t.requires_grad:
            return NotImplemented
        if t.is_nested:  # no single storage view: pickled as torch pickles it
            return NotImplemented
        if t.is_quantized:
            return NotImplemented
        t = t.resolve_conj().resolve_neg()  # lazy conj/neg bits have no NumPy form
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        data = self._storages.get(key)
        if data is None:
            data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            self._storages[key] = data
            self._carriers.add(id(data))
        view = (tuple(t.shape), t.stride(), t.storage_offset())
        return (_tensor_from_storage, (data, str(t.dtype).removeprefix("torch."), *view))


def _reduce_array_as_tensor(obj: Any) -> Any:
    """A NumPy leaf that torch's collate would have made a tensor (see _torch.py)."""
    array = np.asarray(obj)  # (ascontiguousarray would make a 0-d scalar 1-d)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.kind in "SUOV":  # torch leaves these as NumPy
        return NotImplemented
    if not array.flags.writeable:  # would arrive read-only when sent in-band
        array = array.copy()
    buffer = pickle.PickleBuffer(array)  # type: ignore[arg-type, unused-ignore]
    return (_tensor_from_array, (buffer, array.dtype.str, array.shape))


def _tensor_from_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(np.frombuffer(buffer, dtype=dtype).reshape(shape))


def _tensor_from_storage(
    data: np.ndarray, dtype: str, shape: tuple[int, ...], stride: tuple[int, ...], offset: int
) -> Any:
    import torch

    typed = torch.from_numpy(data)
    if dtype != "uint8":
        typed = typed.view(getattr(torch, dtype))
    return torch.as_strided(typed, shape, stride, offset)


def dumps(
    obj: Any,
    buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None,
    *,
    arrays_as_tensors: bool = False,
) -> bytes:
    stream = io.BytesIO()
    pickler = _BatchPickler(
        stream, protocol=5, buffer_callback=buffer_callback, arrays_as_tensors=arrays_as_tensors
    )
    pickler.dump(obj)
    return stream.getvalue()
