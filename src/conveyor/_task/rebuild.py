"""A worker's exception, rebuilt in the main process as an instance of its own type.

The worker side (``_workers/remote_error.py``'s ``capture``) packs the exception as a
:class:`~conveyor._task.protocol.RemoteError`; this is the other half: the very class object
where this process has it (``except CorruptSample`` and ``isinstance`` work), a class
found by module and qualname preferred over a by-value copy (a spawn worker has the
class only by value, as the dataset brought it), and a :class:`WorkerError` naming the
type when it cannot be found at all. Shared by the loop's failures and skip records.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from typing import Any

from conveyor._task.protocol import RemoteError
from conveyor.errors import WorkerError

__all__ = ["lookup", "rebuild"]


def rebuild(error: RemoteError) -> BaseException:
    """The worker's exception, as an instance of its original type where possible."""
    if error.pickled is not None:
        try:
            exc = pickle.loads(error.pickled)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            # Only a module already loaded here can hold a class the user catches.
            cls = _exception_type(lookup(sys.modules.get(error.module), error.qualname))
            return exc if cls is None else _rebuilt_as(exc, cls)
    cls = _import_type(error.module, error.qualname)
    if cls is not None:
        # The constructor may take arguments that ``exc.args`` cannot reproduce:
        # build the instance without calling __init__, as the worker had it.
        args = _try_loads(error.args)
        state = _try_loads(error.state)
        rebuilt = _instantiate(
            cls,
            args if isinstance(args, tuple) else (error.message,),
            state if isinstance(state, dict) else {},
        )
        if rebuilt is not None:
            return rebuilt
    return WorkerError(
        f"{error.module}.{error.qualname}: {error.message} (this exception type could "
        "not be imported in the main process, so it is reported as a WorkerError)"
    )


def _rebuilt_as(exc: BaseException, cls: type[BaseException]) -> BaseException:
    """``exc``, unpickled as a by-value copy of ``cls``, as an instance of ``cls`` itself."""
    copied = type(exc)
    if copied is cls or (copied.__module__, copied.__qualname__) != (
        cls.__module__,
        cls.__qualname__,
    ):
        return exc  # the class itself, or a type its pickle chose on purpose
    return _instantiate(cls, exc.args, dict(getattr(exc, "__dict__", {}))) or exc


def _instantiate(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException | None:
    try:
        exc = cls.__new__(cls, *args)
        exc.args = args
    except Exception:
        return None
    for name, value in state.items():
        try:
            setattr(exc, name, value)
        except Exception:
            continue
    return exc


def lookup(module: object, qualname: str) -> Any:
    """What ``qualname`` names in ``module``; ``None`` if nothing."""
    if module is None:
        return None
    obj: Any = module
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    return obj


def _import_type(module: str, qualname: str) -> type[BaseException] | None:
    try:
        return _exception_type(lookup(importlib.import_module(module), qualname))
    except Exception:
        return None


def _exception_type(obj: object) -> type[BaseException] | None:
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def _try_loads(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:
        return None
