"""The user's objects (dataset, collate_fn, worker_init_fn) on their way to workers
that do not share the main process's memory (spawn, forkserver).

They are cloudpickled once into a memfd every worker maps, so lambdas, closures and
classes defined in ``__main__`` or a notebook travel by value (their code keeping its
file name and, for a notebook cell, its source: see .sources); objects that pickle only
while a process is being spawned (multiprocessing's locks and shared values) travel
with each worker's start instead. A failure names the attribute that does not pickle.
"""

from __future__ import annotations

import collections
import io
import os
import sys
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle

from .._torch import datapipes as _datapipes
from .._transport.arena import SETUP_NAME
from .sources import code_reducers
from .spec import UserObjects
from .start_method import StartMethod

__all__ = ["PickledWhileSpawning", "serialize_for_cluster", "serialize_once"]


def serialize_once(user: UserObjects, start_method: StartMethod) -> int | None:
    """Cloudpickle the user's objects into a memfd that every worker reads.

    None when they hold multiprocessing objects (a ``Lock``, a ``Value``) that pickle
    only while a process is being spawned: they then travel with each worker's start,
    as torch sends its dataset (see :class:`PickledWhileSpawning`)."""
    _pickle_main_by_value()
    try:
        data = _dumps(user)
    except RuntimeError as exc:
        if "through inheritance" in str(exc):
            return None
        raise _explain(user, exc, start_method) from exc
    except Exception as exc:
        raise _explain(user, exc, start_method) from exc
    fd = os.memfd_create(SETUP_NAME, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    return fd


def serialize_for_cluster(user: UserObjects) -> bytes:
    """The user's objects cloudpickled for Ray workers (put in the object store once);
    a failure names the attribute that does not pickle. multiprocessing's locks and
    shared values cannot reach another machine: they fail here, named."""
    _pickle_main_by_value()
    try:
        return _dumps(user)
    except Exception as exc:
        raise _explain(user, exc, None) from exc


def _pickle_main_by_value() -> None:
    """In a process that was itself spawned (Lightning's ddp_spawn,
    torch.multiprocessing.spawn), the parent's script runs as ``__mp_main__``; our
    workers do not run it again, so what it defines travels by value, as cloudpickle
    sends what ``__main__`` defines."""
    main = sys.modules.get("__main__")
    if main is not None and main.__name__ == "__mp_main__":
        cloudpickle.register_pickle_by_value(main)


class _UserPickler(cloudpickle.CloudPickler):
    """cloudpickle, plus conveyor's reducers for objects that pickle their insides by
    reference on their own (torch's DataPipe wrappers, see conveyor._torch.datapipes), and
    for code, which keeps its file name and source (see .sources)."""

    base_table: Any = cloudpickle.CloudPickler.dispatch_table

    def __init__(self, file: io.BytesIO) -> None:
        # Before Pickler.__init__, which is where the C pickler reads the table.
        self.dispatch_table = collections.ChainMap(
            _datapipes.reducers(), code_reducers(self.base_table), self.base_table
        )
        super().__init__(file)


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _UserPickler(buffer).dump(obj)
    return buffer.getvalue()


class PickledWhileSpawning:
    """The user's objects, cloudpickled when ``Process.start`` pickles the worker's
    arguments: multiprocessing's locks and shared values accept to be pickled only
    then (and a shared value passes its file descriptor to that one child)."""

    def __init__(self, user: UserObjects) -> None:
        self.user = user

    def __reduce__(self) -> tuple[Any, ...]:
        buffer = io.BytesIO()
        _SpawningPickler(buffer).dump(self.user)
        return (cloudpickle.loads, (buffer.getvalue(),))


class _SpawningPickler(_UserPickler):
    """cloudpickle, plus the reducers multiprocessing registers for its own objects
    (a shared value's memory travels as a file descriptor passed to the child)."""

    base_table = collections.ChainMap(
        ForkingPickler._extra_reducers,  # type: ignore[attr-defined]
        cloudpickle.CloudPickler.dispatch_table,
    )


def _explain(user: UserObjects, error: Exception, start_method: StartMethod | None) -> Exception:
    """``start_method`` None: the objects go to Ray workers."""
    from ..diagnostics.pickling import explain_unpicklable

    where: dict[str, Any] = (
        {"start_method": start_method.name}
        if start_method is not None
        else {"worker_method": "ray"}
    )
    for role in ("dataset", "collate_fn", "worker_init_fn"):
        obj = getattr(user, role)
        try:
            _dumps(obj)
        except Exception as exc:
            return explain_unpicklable(obj, role, exc, role=role, **where)
    registrations = user.collate_registrations
    if registrations is not None:
        for root, items in (
            ("torch's default_collate_fn_map", registrations.torch_items or ()),
            ("conveyor.collate.default_collate_fn_map", registrations.own_items),
        ):
            for key, fn in items:
                name = f"{root}[{key.__qualname__ if isinstance(key, type) else repr(key)}]"
                try:
                    _dumps((key, fn))
                except Exception as exc:
                    return explain_unpicklable(
                        fn,
                        name,
                        exc,
                        role="registered collate function",
                        **where,
                    )
    return error
