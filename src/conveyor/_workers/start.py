"""Start a worker process without re-running the user's ``__main__``.

multiprocessing's spawn and forkserver children normally re-import the main
script (as ``__mp_main__``) so that pickles can find classes defined there.
conveyor sends the dataset, collate_fn and worker_init_fn with cloudpickle,
which carries ``__main__`` classes and functions by value, so the workers
don't need it. Skipping it makes unguarded scripts, notebooks and ``python -``
work, and keeps a training script's top level from running once per worker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import spawn
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from .._torch import DEFER_ENV
from .fork_gate import gates_held
from .interrupts import interrupts_deferred
from .start_method import StartMethod

_lock = threading.Lock()  # held by every start; a fork waits for the others (see _start)
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
FORKSERVER_PRELOAD = ["conveyor._workers.loop"]


def start_process(method: StartMethod, process: BaseProcess, preload: Sequence[str] = ()) -> None:
    """Start a worker process from the calling thread, whichever it is.

    A worker dies with the main process through its parent-watch pipe
    (``parent_watch.py``), whatever thread started it: no thread of conveyor's has to
    outlive the start, so none is left to make later forks in this process (anyone's)
    the fork of a multi-threaded one. A Ctrl-C in the main thread waits until the start
    is complete: cut in half, it would leave a child blocked for its instructions and
    pipes that only the lost ``Popen`` object could close.
    """
    with interrupts_deferred():  # (nothing to defer off the main thread: no signal there)
        _start(method, process, preload)


def _after_fork_in_child() -> None:
    """A forked child has none of this process's other threads, and the locks the
    forking thread held stay held in it: start afresh, for loaders made in a worker."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start(method: StartMethod, process: BaseProcess, preload: Sequence[str]) -> None:
    """Every start holds ``_lock``, so a fork never copies another thread mid-start, and
    every gate, so it never copies a thread of ours mid-work."""
    with _lock:
        if method.copies_memory:
            with gates_held():
                process.start()
            return
        if method.uses_server:
            _preload_forkserver(method.context(), preload)
        with _without_main(), _deferring_torch():
            process.start()


@contextmanager
def _deferring_torch() -> Iterator[None]:
    """Start the child with torch deferred (it inherits the environment)."""
    before = os.environ.get(DEFER_ENV)
    os.environ[DEFER_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[DEFER_ENV]
        else:
            os.environ[DEFER_ENV] = before


@contextmanager
def _without_main() -> Iterator[None]:
    original = spawn.get_preparation_data

    def preparation_data(name: str) -> dict[str, Any]:
        data: dict[str, Any] = original(name)
        for key in _MAIN_KEYS:
            data.pop(key, None)
        return data

    spawn.get_preparation_data = preparation_data
    try:
        yield
    finally:
        spawn.get_preparation_data = original


def _preload_forkserver(context: BaseContext, extra: Sequence[str]) -> None:
    """Have a fork server we start import what workers import, not ``__main__``.

    That is our worker code and the modules defining the user's dataset and
    functions (which import torch if the dataset uses it): imported once in
    the server, shared by every worker it forks. The fork server is one per
    interpreter: if the program already started it, this changes nothing.
    """
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is None:
        preload = [m for m in server._preload_modules if m != "__main__"]
        wanted = [*FORKSERVER_PRELOAD, *extra]
        context.set_forkserver_preload([*preload, *(m for m in wanted if m not in preload)])


def modules_to_preload(*objects: Any) -> list[str]:
    """Importable modules (not ``__main__``) that define these objects or their types."""
    names = []
    for obj in objects:
        if obj is None:
            continue
        module = getattr(obj, "__module__", None) or type(obj).__module__
        if not isinstance(module, str):
            module = type(obj).__module__
        if module and module not in ("__main__", "builtins") and module not in names:
            names.append(module)
    return names
