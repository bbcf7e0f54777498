"""Carry a worker's exception to the main process with its type intact."""

from __future__ import annotations

import importlib
import pickle
import traceback
from typing import Any

import cloudpickle

from ..errors import WorkerError
from .protocol import RemoteError


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
        traceback="".join(traceback.format_exception(cls, exc, exc.__traceback__)),
    )


def rebuild(error: RemoteError) -> BaseException:
    """The worker's exception, as an instance of its original type where possible."""
    if error.pickled is not None:
        try:
            exc = pickle.loads(error.pickled)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            return exc
    cls = _import_type(error.module, error.qualname)
    if cls is not None:
        # The constructor may take arguments that ``exc.args`` cannot reproduce:
        # build the instance without calling __init__, as the worker had it.
        args = _try_loads(error.args)
        exc = cls.__new__(cls, *(args if isinstance(args, tuple) else (error.message,)))
        exc.args = args if isinstance(args, tuple) else (error.message,)
        state = _try_loads(error.state)
        if isinstance(state, dict):
            for name, value in state.items():
                try:
                    setattr(exc, name, value)
                except Exception:
                    continue
        return exc
    return WorkerError(
        f"{error.module}.{error.qualname}: {error.message} (this exception type could "
        "not be imported in the main process, so it is reported as a WorkerError)"
    )


def _import_type(module: str, qualname: str) -> type[BaseException] | None:
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def _instance_state(exc: BaseException) -> dict[str, Any]:
    state = dict(getattr(exc, "__dict__", {}))
    # Notes and our own context are re-attached in the main process.
    state.pop("__notes__", None)
    state.pop("conveyor_context", None)
    return state


def _try_dumps(obj: object) -> bytes | None:
    try:
        return cloudpickle.dumps(obj)
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
