"""Calls the training loop makes on the main process's dataset between epochs
(``dataset.set_epoch(epoch)``, and the methods a loader's ``epoch_calls`` names), carried
to every worker's copy of the dataset.

How the main process learns of a call: the loader puts a :class:`_Recorder` in the
dataset *instance*'s ``__dict__`` under the method's name (never in its class: other
instances, and the class itself, are untouched). Python finds an instance's own
attribute before its class's method, so ``dataset.set_epoch(3)`` runs the recorder,
which runs the class's method on that object and then records the call (only one that
returned: a call that raised changed nothing to carry). Reading the dataset's state at
an epoch's start instead would not know a method's arguments, nor which attributes it
set (a Hugging Face dataset changes a shared tensor in place), and would carry whatever
else the main process changed on it (a handle it opened, a cache).

A :class:`CallLog` keeps the last call of each method, in the order they were made
(replaying the last one is what a setter such as ``set_epoch`` needs; a method that
steps a counter would step it twice in a worker that was started after the call). The
loop sends the log's calls to every worker when an epoch starts, if a call was made
since it last sent them (:class:`Forwarder`); a worker makes them on its own copy with
the class's method (:func:`replay`), never through a recorder it may have inherited.

What can go wrong with the recorder, and what is done about it: pickling or deep-copying
the dataset gives the copy the real method bound to the copy (``__reduce__``), so
spawned workers and the user's own pickles hold nothing of conveyor's; a shallow copy
shares the instance's ``__dict__`` entries, recorder included, so the copies conveyor
makes (thread workers, threads of a worker process) drop it (:func:`detach`). An object
without a ``__dict__`` (``__slots__``), a method that is an instance attribute or comes
through ``__getattr__``, or a property of that name is not watched:
:func:`unwatched_names` says which, for the pre-flight.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CallLog",
    "DatasetCall",
    "Forwarder",
    "calls_of",
    "detach",
    "log_of",
    "replay",
    "replay_in_main",
    "unwatched_names",
    "watch",
]

_MISSING = object()


@dataclass(frozen=True)
class DatasetCall:
    """One call of a dataset's method: its name and arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()

    def apply(self, dataset: Any) -> None:
        """Make this call on ``dataset`` with its class's method (never a recorder)."""
        _method(dataset, self.name)(*self.args, **dict(self.kwargs))

    def __str__(self) -> str:
        words = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(words)})"


class CallLog:
    """The last call of each watched method of one dataset object, in the order they
    were made; ``serial`` counts the calls, so a reader can tell that one was made."""

    def __init__(self) -> None:
        self._last: dict[str, DatasetCall] = {}
        self._lock = threading.Lock()
        self.serial = 0

    def record(self, call: DatasetCall) -> None:
        with self._lock:
            self._last.pop(call.name, None)  # to the end: the order of the last calls
            self._last[call.name] = call
            self.serial += 1

    def calls(self, names: Iterable[str]) -> tuple[DatasetCall, ...]:
        """The last calls of the methods ``names``, oldest first."""
        wanted = set(names)
        with self._lock:
            return tuple(call for call in self._last.values() if call.name in wanted)


class _Recorder:
    """A dataset instance's ``__dict__`` entry in place of its class's method: makes the
    call on the instance, then records it."""

    def __init__(self, owner: Any, name: str, log: CallLog) -> None:
        self.owner = owner
        self.name = name
        self.log = log
        method = _method(owner, name)
        # What introspection reads (inspect.signature follows __wrapped__).
        self.__wrapped__ = method
        self.__doc__ = getattr(method, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = _method(self.owner, self.name)(*args, **kwargs)
        self.log.record(DatasetCall(self.name, args, tuple(kwargs.items())))
        return result

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A pickled or deep-copied dataset gets the class's method bound to the copy
        # (looked up while the copy's __dict__ is still empty): nothing of conveyor's.
        return getattr, (self.owner, self.name)

    def __repr__(self) -> str:
        return f"{_method(self.owner, self.name)!r} (its calls reach conveyor's workers)"


def _method(obj: Any, name: str) -> Any:
    """``obj``'s method ``name`` as its class defines it, bound to ``obj`` (looked up on
    each call, as Python looks it up: a method patched on the class later is the one
    called)."""
    cls = type(obj)
    for klass in cls.__mro__:
        attribute = klass.__dict__.get(name, _MISSING)
        if attribute is not _MISSING:
            get = getattr(type(attribute), "__get__", None)
            return get(attribute, obj, cls) if get is not None else attribute
    raise AttributeError(f"{cls.__name__!r} object has no method {name!r}")


def _own(obj: Any) -> dict[str, Any] | None:
    """The instance's ``__dict__`` (None: it has none)."""
    try:
        own = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return own if isinstance(own, dict) else None


def _watchable(obj: Any, name: str, own: dict[str, Any] | None) -> bool:
    """The class defines ``name`` as a method an instance entry can stand in for."""
    if own is None or (name in own and not isinstance(own[name], _Recorder)):
        return False
    attribute = inspect.getattr_static(type(obj), name, _MISSING)
    if attribute is _MISSING or hasattr(type(attribute), "__set__"):  # a property wins
        return False
    try:
        return callable(_method(obj, name))
    except Exception:
        return False


def watch(dataset: Any, names: Iterable[str]) -> CallLog | None:
    """Record the calls of the methods ``names`` that ``dataset``'s class defines (see the
    module docstring); every loader of that object shares its log. None: none of them
    can be watched (or the dataset has none of them)."""
    own = _own(dataset)
    log = log_of(dataset) or CallLog()
    watched = False
    for name in names:
        entry = own.get(name) if own is not None else None
        if isinstance(entry, _Recorder) and entry.owner is dataset:
            watched = True
        elif _watchable(dataset, name, own):
            assert own is not None
            own[name] = _Recorder(dataset, name, log)  # not setattr: no __setattr__ of theirs
            watched = True
    return log if watched else None


def log_of(dataset: Any) -> CallLog | None:
    """The log of ``dataset``'s watched calls (None: nothing of it is watched)."""
    for entry in (_own(dataset) or {}).values():
        if isinstance(entry, _Recorder) and entry.owner is dataset:
            return entry.log
    return None


def calls_of(dataset: Any, names: Iterable[str]) -> tuple[DatasetCall, ...]:
    """The last calls made of ``dataset``'s watched methods ``names``, oldest first."""
    log = log_of(dataset)
    return log.calls(names) if log is not None else ()


def unwatched_names(dataset: Any, names: Iterable[str]) -> tuple[str, ...]:
    """Of ``names``, the methods ``dataset`` has (callable attributes) whose calls are not
    watched: for the pre-flight, which says what would not reach the workers."""
    own = _own(dataset) or {}
    missed = []
    for name in names:
        entry = own.get(name)
        if isinstance(entry, _Recorder) and entry.owner is dataset:
            continue
        try:
            has = callable(getattr(dataset, name, None))
        except Exception:  # a __getattr__ of the dataset's own may raise anything
            has = False
        if has:
            missed.append(name)
    return tuple(missed)


def detach(copied: Any) -> Any:
    """A shallow copy of a dataset without the recorders it shares with the original
    (they would make its calls on the original): its calls are its own again. A copy
    that shares the original's very ``__dict__`` (a class whose ``__getstate__`` returns
    it) is left as it is: it shares everything anyway."""
    own = _own(copied)
    if own is None:
        return copied
    for name, entry in list(own.items()):
        if isinstance(entry, _Recorder) and entry.owner is not copied:
            if _own(entry.owner) is own:
                break
            del own[name]
    return copied


def replay(dataset: Any, calls: Iterable[DatasetCall]) -> None:
    """Make ``calls`` on a worker's copy of the dataset, in order."""
    for call in calls:
        call.apply(dataset)


def replay_in_main(dataset: Any, calls: Iterable[DatasetCall], names: tuple[str, ...]) -> None:
    """A loaded state's calls, made on the main process's dataset as the user would make
    them (recorded, so that workers get them as any call): the calls of methods ``names``
    the dataset has."""
    for call in calls:
        if call.name in names and callable(method := getattr(dataset, call.name, None)):
            method(*call.args, **dict(call.kwargs))


class Forwarder:
    """The loop's side: what to send the workers as an epoch starts."""

    def __init__(self, dataset: Any, names: tuple[str, ...]) -> None:
        self._log = log_of(dataset)
        self._names = names
        self._serial = self._log.serial if self._log is not None else 0
        self.current = self.latest()  # what the workers have (their copies were made now)

    def latest(self) -> tuple[DatasetCall, ...]:
        """The last calls made, whether sent or not."""
        return self._log.calls(self._names) if self._log is not None else ()

    def news(self) -> tuple[DatasetCall, ...] | None:
        """The calls to send as an epoch starts: all the last ones, if one was made since
        they were last sent (None: none was)."""
        log = self._log
        if log is None or log.serial == self._serial:
            return None
        self._serial = log.serial
        self.current = log.calls(self._names)
        return self.current
