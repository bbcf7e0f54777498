"""Carry a worker's exception to the main process with its type intact (this is the
worker's half; ``conveyor._task.rebuild`` the main process's).

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

import io
import sys
import traceback
from typing import Any

import cloudpickle

from .._task.protocol import RemoteError
from .._task.rebuild import lookup
from .._transport.main_classes import reduce_sent_class
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
    return lookup(sys.modules.get(cls.__module__), cls.__qualname__) is cls


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


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"
