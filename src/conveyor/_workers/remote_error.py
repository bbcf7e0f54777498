"""Carry a worker's exception to the main process with its type intact.

"Intact" means the very class object, so that ``except CorruptSample`` and
``isinstance`` work in the main process. cloudpickle copies every ``__main__``
class by value, which under fork would make a *new* class with the same name:
``capture`` sends a class by reference whenever its name finds that same class
in the worker (a forked worker shares the parent's ``__main__``), a class the main
process sent by value (a spawn worker's copy of a ``__main__`` class) as a reference
to the main process's own (see conveyor._transport.main_classes), and
``rebuild`` prefers the class the main process finds by module and qualname
over a by-value copy (a spawn worker has the class only by value, as the
dataset brought it). A class found nowhere (defined in a function) still comes
back as a copy with the same name, message and notes.
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import traceback
from typing import Any

import cloudpickle

from .._transport.main_classes import reduce_sent_class
from ..errors import WorkerError
from .protocol import RemoteError
from .sources import missing_sources


def capture(exc: BaseException) -> RemoteError:
    """Pack ``exc`` (raised in this worker) for sending."""
    cls = type(exc)
    return RemoteError(
        pickled=_try_dumps(exc),
        module=cls.__module__,
        qualname=cls.__qualname__,
        args=_try_dumps(exc.args),
        state=_try_dumps(_instance_state(exc)),
        message=_safe_str(exc),
        traceback="".join(traceback.format_exception(cls, exc, exc.__traceback__))
        + missing_sources(exc),
    )


def rebuild(error: RemoteError) -> BaseException:
    """The worker's exception, as an instance of its original type where possible."""
    if error.pickled is not None:
        try:
            exc = pickle.loads(error.pickled)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            # Only a module already loaded here can hold a class the user catches.
            cls = _exception_type(_lookup(sys.modules.get(error.module), error.qualname))
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


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, but a ``__main__`` class goes by reference when its name finds it,
    and a class the main process sent by value goes back as a reference to its own."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type) and obj.__module__ == "__main__" and _by_name(obj):
            return NotImplemented  # pickle's own save_global: by reference
        sent = reduce_sent_class(obj)
        if sent is not None:
            return sent
        return super().reducer_override(obj)


def _by_name(cls: type) -> bool:
    """Whether ``cls`` is what its module and qualname find in this process."""
    return _lookup(sys.modules.get(cls.__module__), cls.__qualname__) is cls


def _lookup(module: object, qualname: str) -> Any:
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
        return _exception_type(_lookup(importlib.import_module(module), qualname))
    except Exception:
        return None


def _exception_type(obj: object) -> type[BaseException] | None:
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def _instance_state(exc: BaseException) -> dict[str, Any]:
    state = dict(getattr(exc, "__dict__", {}))
    # Notes and our own context are re-attached in the main process.
    state.pop("__notes__", None)
    state.pop("conveyor_context", None)
    return state


def _try_dumps(obj: object) -> bytes | None:
    try:
        with io.BytesIO() as buffer:
            _Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
            return buffer.getvalue()
    except Exception:
        return None


def _try_loads(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:
        return None


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"
