"""Resources opened once per process: what a forked worker must not share.

A database connection or file handle opened in a dataset's ``__init__`` is
opened in the main process and copied into every worker. Under ``fork`` the
workers then share it — one file offset, one SQLite connection state — and
reads interleave or the database reports corruption; under ``spawn`` and
``forkserver`` the dataset does not even pickle. :func:`per_worker` holds the
*recipe* instead: each process opens its own handle the first time it asks
for it, and closes it when the worker exits::

    class Images(Dataset):
        def __init__(self, db_path):
            self.db = conveyor.per_worker(sqlite3.connect, db_path)  # not sqlite3.connect(db_path)

        def __getitem__(self, i):
            return self.db.get().execute("SELECT data FROM images WHERE id = ?", (i,)).fetchone()

The same works for ``per_worker(open, path, "rb")``, ``per_worker(lmdb.open,
path, readonly=True, lock=False)``, an HTTP session, a tokenizer with native
state... It works with torch's ``DataLoader`` too.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from multiprocessing import util as mp_util
from typing import Any, Generic, TypeVar

from conveyor._workers import scope as _scope
from conveyor._workers.scope import WorkerScope

__all__ = ["PerWorker", "close_all", "per_worker"]

T = TypeVar("T")
_EXIT_PRIORITY = 100  # multiprocessing runs higher priorities first at process exit


class _Handle:
    """One PerWorker's open resources in this process, one per worker core that asked
    (a core's scope; None outside any worker); shared with its finalizer, never with
    its copies."""

    __slots__ = ("__weakref__", "close", "label", "pid", "resources")

    def __init__(self, close: Callable[[Any], object], label: str) -> None:
        self.close = close
        self.label = label
        self.pid: int | None = None  # the process that opened ``resources``
        self.resources: dict[WorkerScope | None, Any] = {}


# Handles with resources open in this process, oldest first (closed newest first). A
# forked child inherits the parent's entries: they carry the parent's pid and are skipped.
_open: dict[int, _Handle] = {}
# Resources a forked child inherited: never used, never closed, kept alive so
# that no destructor runs on the parent's connection in the child.
_inherited: list[Any] = []
_lock = threading.RLock()  # opening may itself use another PerWorker: reentrant
_exit_hook_pid: int | None = None
_pid = os.getpid()  # cached: os.getpid() is a system call, get() runs once per sample
_MISSING = object()


def _after_fork_in_child() -> None:
    global _lock, _pid
    _lock = threading.RLock()  # another thread of the parent may have held it
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


class PerWorker(Generic[T]):
    """A resource that each process opens for itself, on first use.

    Build one with :func:`per_worker`. ``get()`` (or calling the object)
    returns this process's resource, opening it the first time. The object
    pickles as its recipe — the factory and its arguments — never as the open
    resource, so a dataset holding it travels to ``spawn`` and ``forkserver``
    workers; under ``fork`` a worker that finds its parent's handle ignores it
    and opens its own.

    The resource is closed when the worker process exits, when the object is
    garbage collected, or when the main process exits; ``close()`` closes it
    now (the next ``get()`` opens it again).
    """

    def __init__(
        self,
        factory: Callable[..., T],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        close: Callable[[T], object] | None = None,
    ) -> None:
        if not callable(factory) or _looks_open(factory):
            raise TypeError(
                f"per_worker() takes the function that opens the resource and its "
                f"arguments, e.g. per_worker(sqlite3.connect, path), not "
                f"{type(factory).__name__} object {factory!r:.80}: an object that is "
                f"already open would be shared by every worker."
            )
        if close is not None and not callable(close):
            raise TypeError(f"close must be a function of the resource or None, not {close!r}")
        self._factory = factory
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._close = close
        self._handle = _Handle(_default_close if close is None else close, _describe(factory))
        weakref.finalize(self, _finalize, self._handle)

    def get(self) -> T:
        """This worker's resource, opened now if this worker has not opened it yet."""
        handle = self._handle
        if handle.pid == _pid:
            resource = handle.resources.get(_scope.current(), _MISSING)
            if resource is not _MISSING:
                return resource  # type: ignore[no-any-return, unused-ignore]
        return self._open()

    __call__ = get

    def _open(self) -> T:
        handle = self._handle
        scope = _scope.current()
        with _lock:
            if handle.pid == _pid and scope in handle.resources:
                resource: T = handle.resources[scope]  # another thread opened it meanwhile
                return resource
            if handle.pid != _pid and handle.resources:
                # Copied here by fork: the parent's resources are the parent's.
                _inherited.extend(handle.resources.values())
                handle.resources = {}
            resource = self._factory(*self._args, **self._kwargs)
            handle.resources[scope] = resource
            handle.pid = _pid
            _open[id(handle)] = handle
            _close_at_exit()
        return resource

    @property
    def is_open(self) -> bool:
        """Whether this worker (or the main process, outside workers) has it open."""
        return self._handle.pid == _pid and _scope.current() in self._handle.resources

    def close(self) -> None:
        """Close this worker's resource, if open; the next ``get()`` reopens it."""
        _close_handle(self._handle, _scope.current())

    def __reduce__(self) -> tuple[Any, ...]:
        return (PerWorker, (self._factory, self._args, self._kwargs, self._close))

    def __repr__(self) -> str:
        arguments = [repr(a) for a in self._args]
        arguments += [f"{k}={v!r}" for k, v in self._kwargs.items()]
        where = "this process" if _scope.current() is None else "this worker"
        state = f"open in pid {_pid}" if self.is_open else f"not open in {where}"
        return f"<PerWorker {self._handle.label}({', '.join(arguments)}): {state}>"


def per_worker(
    factory: Callable[..., T],
    *args: Any,
    close: Callable[[T], object] | None = None,
    **kwargs: Any,
) -> PerWorker[T]:
    """A :class:`PerWorker` that opens ``factory(*args, **kwargs)`` once per process.

    ``close`` is called with the resource to close it; by default its
    ``close()`` method is called, if it has one. ``factory``, its arguments and
    ``close`` must pickle for ``spawn`` / ``forkserver`` workers (module-level
    functions and plain values do; conveyor's own loader also sends lambdas).

    A SQLite connection opened this way belongs to the worker's main thread
    (SQLite's ``check_same_thread``); pass ``check_same_thread=False`` to
    share it between threads of one process.
    """
    return PerWorker(factory, args, kwargs, close)


def close_all(everyone: bool = False) -> None:
    """Close every resource this worker opened, newest first (``everyone``: every
    worker's in this process, as at process exit).

    Runs when a worker leaves its loop and at process exit. Worker processes
    end with ``os._exit``, which skips ``atexit``; multiprocessing still runs
    its own exit finalizers first, and that is where this is registered, so it
    also runs in torch's workers. A failure to close one resource is printed
    to stderr and the others are still closed.
    """
    pid, scope = _pid, _scope.current()
    with _lock:
        mine = [
            (handle, owner)
            for handle in _open.values()
            if handle.pid == pid
            for owner in list(handle.resources)
            if everyone or owner is scope
        ]
    for handle, owner in reversed(mine):
        try:
            _close_handle(handle, owner)
        except Exception:
            print(
                f"conveyor: closing the per-worker resource {handle.label} in process "
                f"{pid} failed:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )


def _close_handle(handle: _Handle, scope: WorkerScope | None) -> None:
    with _lock:
        if handle.pid != _pid or scope not in handle.resources:
            return
        resource = handle.resources.pop(scope)
        if not handle.resources:
            _open.pop(id(handle), None)
    handle.close(resource)


def _finalize(handle: _Handle) -> None:
    """The PerWorker was garbage collected (or the interpreter is exiting)."""
    if handle.pid is not None and handle.pid != _pid:
        # The parent's: don't run their destructors here.
        _inherited.extend(handle.resources.values())
        return
    for scope in list(handle.resources):
        _close_handle(handle, scope)


def _close_at_exit() -> None:
    """Register :func:`close_all` with multiprocessing's exit, once per process.

    multiprocessing runs these in every child it starts, just before
    ``os._exit``, and at interpreter exit in the main process; a child's
    registry starts empty, so each process registers for itself.
    """
    global _exit_hook_pid
    if _exit_hook_pid != _pid:
        _exit_hook_pid = _pid
        mp_util.Finalize(None, close_all, args=(True,), exitpriority=_EXIT_PRIORITY)


def _looks_open(factory: object) -> bool:
    """An object with a ``close()`` (a sqlite3.Connection is callable, too)."""
    return not isinstance(factory, type) and callable(getattr(factory, "close", None))


def _default_close(resource: object) -> None:
    close = getattr(resource, "close", None)
    if callable(close):
        close()


def _describe(factory: Callable[..., Any]) -> str:
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None)
    if name is None:
        return repr(factory)
    if module in (None, "builtins", "io", "_io"):
        return str(name)
    return f"{module.lstrip('_')}.{name}"  # _sqlite3.connect -> sqlite3.connect
