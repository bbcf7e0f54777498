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
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import spawn
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from .._torch import DEFER_ENV
from ..config import StartMethod
from .interrupts import interrupts_deferred

_lock = threading.Lock()
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
FORKSERVER_PRELOAD = ["conveyor._workers.loop"]


def start_process(method: StartMethod, process: BaseProcess, preload: Sequence[str] = ()) -> None:
    """Start ``process`` from a thread that lives as long as this process.

    Workers ask the kernel to kill them when their parent dies
    (``PR_SET_PDEATHSIG``), and the kernel means the parent *thread*: workers
    started from a short-lived thread (an evaluation thread) would die with it.
    So they are started from the main thread, or else from one daemon thread
    kept for this. A Ctrl-C in the main thread waits until the start is complete:
    cut in half, it would leave a child blocked for its instructions and pipes
    that only the lost ``Popen`` object could close.
    """
    if threading.current_thread() is threading.main_thread():
        with interrupts_deferred():
            _start(method, process, preload)
    else:
        _Starter.get().run(lambda: _start(method, process, preload))


class _Starter:
    """A daemon thread that starts processes for other threads, one at a time."""

    _instance: _Starter | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], None], list[BaseException], threading.Event]
        ]
        self._jobs = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="conveyor-process-starter", daemon=True).start()

    @classmethod
    def get(cls) -> _Starter:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def run(self, job: Callable[[], None]) -> None:
        errors: list[BaseException] = []
        done = threading.Event()
        self._jobs.put((job, errors, done))
        done.wait()
        if errors:
            raise errors[0]

    def _serve(self) -> None:
        while True:
            job, errors, done = self._jobs.get()
            try:
                job()
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()


def _start(method: StartMethod, process: BaseProcess, preload: Sequence[str]) -> None:
    if method.copies_memory:
        process.start()
        return
    if method.uses_server:
        _preload_forkserver(method.context(), preload)
    with _lock, _without_main(), _deferring_torch():
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
