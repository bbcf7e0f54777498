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
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing import spawn
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar

from .._torch import DEFER_ENV
from ..config import StartMethod
from .interrupts import interrupts_deferred

_lock = threading.Lock()  # held by every start; a fork waits for the others (see _start)
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
FORKSERVER_PRELOAD = ["conveyor._workers.loop"]
THREAD_NAME = "conveyor-process-starter"


class Starter:
    """Starts one pool's processes from a thread that outlives them.

    Workers ask the kernel to kill them when their parent dies
    (``PR_SET_PDEATHSIG``), and the kernel means the parent *thread*: workers
    started from a short-lived thread (an evaluation thread) would die with it.
    So they are started from the main thread, or else from a daemon thread of the
    pool's own, which :meth:`close` stops once the pool's processes are gone: a
    thread left behind would make every later fork in this process, anyone's, the
    fork of a multi-threaded process. A Ctrl-C in the main thread waits until the
    start is complete: cut in half, it would leave a child blocked for its
    instructions and pipes that only the lost ``Popen`` object could close.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()

    def start(self, method: StartMethod, process: BaseProcess, preload: Sequence[str] = ()) -> None:
        if threading.current_thread() is threading.main_thread():
            with interrupts_deferred():
                _start(method, process, preload)
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=_serve, args=(self._jobs,), name=THREAD_NAME, daemon=True
            )
            self._thread.start()
        job = _Job(lambda: _start(method, process, preload))
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error

    def close(self) -> None:
        """Stop the thread, if there is one: call once the processes it started are gone."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._jobs.put(None)
        if thread is not threading.current_thread():
            thread.join()


@dataclass
class _Job:
    run: Callable[[], None]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The starter thread: run each job until ``None`` comes."""
    while (job := jobs.get()) is not None:
        try:
            job.run()
        except BaseException as exc:
            job.error = exc
        finally:
            job.done.set()


class ForkGate:
    """Held by one of conveyor's threads while it works (the pin thread, while it
    pins). A fork waits until every gate is free: a thread copied into the child
    mid-work could hold a lock there that nothing will ever release."""

    _all: ClassVar[weakref.WeakSet[ForkGate]] = weakref.WeakSet()

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a thread forking under its own gate must not wait
        ForkGate._all.add(self)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@contextmanager
def _gates_held() -> Iterator[None]:
    with ExitStack() as held:
        for gate in list(ForkGate._all):
            held.enter_context(gate)
        yield


def _after_fork_in_child() -> None:
    """A forked child has none of this process's other threads, and the locks the
    forking thread held stay held in it: start afresh, for loaders made in a worker."""
    global _lock
    _lock = threading.Lock()
    ForkGate._all = weakref.WeakSet()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start(method: StartMethod, process: BaseProcess, preload: Sequence[str]) -> None:
    """Every start holds ``_lock``, so a fork never copies a starter thread mid-start,
    and every gate, so it never copies a thread of ours mid-work."""
    with _lock:
        if method.copies_memory:
            with _gates_held():
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
