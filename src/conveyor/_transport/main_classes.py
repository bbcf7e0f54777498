"""Classes the main process sent to a worker by value go back as the main process's own.

Under spawn and forkserver the user's objects reach a worker through cloudpickle, which
copies by value what the worker cannot import: classes defined in the training script's
``__main__``, a notebook or ``python -`` (workers do not run the script again). It tags
each such class with an id and remembers it, in the main process and in the worker.

A sample, batch or exception of one of those classes cannot go back by name (the
worker's ``__main__`` is not the script), and going back by value would not do either:
cloudpickle, recognising the id, re-sets every attribute of the main process's class
with the worker's copies (its methods would then read a copy of the script's globals).
So the class travels as its id, and the main process answers with its own class:
``isinstance(batch.point, Point)`` holds and ``except MyError`` catches, as under fork.

Only class objects are looked up, and only while cloudpickle has tracked any class in
this process: the common batch (arrays, tensors, dicts) pays nothing.
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any

__all__ = ["main_class", "reduce_sent_class"]

# cloudpickle's own record of the classes it copied (present from 2.2.1 to 3.1 at least):
# id -> class, and class -> id, both weak. Without them, classes go back as before.
_tracker = importlib.import_module("cloudpickle.cloudpickle")
_BY_CLASS: Any = getattr(_tracker, "_DYNAMIC_CLASS_TRACKER_BY_CLASS", None)
_BY_ID: Any = getattr(_tracker, "_DYNAMIC_CLASS_TRACKER_BY_ID", None)


def reduce_sent_class(obj: Any) -> tuple[Any, ...] | None:
    """How to pickle ``obj`` if it is a class this process got by value from the main
    process; None for anything else (pickled as usual)."""
    if not _BY_CLASS or not issubclass(type(obj), type):
        return None
    try:
        tracker_id = _BY_CLASS.get(obj)
    except TypeError:  # a class that refuses weak references is never tracked
        return None
    if tracker_id is None:
        return None
    return (main_class, (tracker_id, obj.__module__, obj.__qualname__))


def main_class(tracker_id: str, module: str, qualname: str) -> type:
    """The main process's class that it sent as ``tracker_id`` (run when unpickling)."""
    cls = _BY_ID.get(tracker_id) if _BY_ID is not None else None
    if cls is None:
        raise pickle.UnpicklingError(
            f"A worker sent back an object of the class {module}.{qualname}, which this "
            "process had sent it by value, but this process no longer has that class (it "
            "was deleted or redefined since the workers started). Define it once, at the "
            "top level of the script or of a module, and keep it."
        )
    return cls
