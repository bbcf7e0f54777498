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
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import spawn
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from .._torch import DEFER_ENV

_lock = threading.Lock()
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
FORKSERVER_PRELOAD = ["conveyor._workers.loop"]


def start_process(context: BaseContext, process: BaseProcess) -> None:
    if context.get_start_method() == "fork":
        process.start()
        return
    if context.get_start_method() == "forkserver":
        _preload_forkserver(context)
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


def _preload_forkserver(context: BaseContext) -> None:
    """Have a fork server we start import our worker code, not ``__main__``.

    The fork server is one per interpreter: if the program already started
    it, this changes nothing.
    """
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is None:
        preload = [m for m in server._preload_modules if m != "__main__"]
        context.set_forkserver_preload(
            [*preload, *(m for m in FORKSERVER_PRELOAD if m not in preload)]
        )
