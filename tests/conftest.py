"""Suite-wide collection rules."""

from __future__ import annotations

import gc
import importlib.util
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

_UNIT = Path(__file__).parent / "unit"
# Modules whose forkserver variants run with -m slow too: each starts workers that import
# torch afresh (2-5 s a variant), and their fork variants cover the same code; other
# modules' forkserver variants keep pickled objects covered in the default run.
_FORKSERVER_SLOW = frozenset({
    "test_torch_free_workers.py", "test_collate_fn_map.py", "test_reseed.py",
    "test_round_trip.py", "test_torch_parity.py", "test_streaming_collate.py",
})  # fmt: skip
_HAVE_TORCH = importlib.util.find_spec("torch") is not None
# Modules whose tests share something costly or fixed among themselves (a Ray cluster, a
# torchrun port, ranks of processes, a module fixture): pytest-xdist runs each of them in
# one worker (``--dist loadgroup``), the rest of the suite test by test. The Ray modules
# share one: two local clusters at once get in each other's way (a test that ends a
# cluster's processes, or counts its workers, finds the other's).
_XDIST_GROUPS = {
    "test_ray_workers.py": "ray", "test_ray_faults.py": "ray",
    "test_accelerate.py": "accelerate", "test_lightning.py": "lightning",
    "test_elastic_ranks.py": "ranks", "test_torchvision.py": "torchvision",
    "test_troubleshooting_examples.py": "troubleshooting",
}  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C raises KeyboardInterrupt here and in every child the tests start, as in a
    terminal: a shell without job control (CI's background lanes) starts its jobs with
    SIGINT ignored, which children would inherit, and the tests that send a real SIGINT
    would then wait forever for it.

    On Python 3.12+ the tests run in this process (no pytest-xdist workers): a worker
    always has execnet's threads (started with ``_thread``: not in ``threading``), so
    each fork a test makes would warn that the process is multi-threaded, and the tests
    that record every warning a loader gives would see that one too. (This runs before
    pytest-xdist's own configure, which then starts no worker.)"""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.version_info >= (3, 12) and getattr(config.option, "numprocesses", None):
        config.option.numprocesses = 0
        config.option.dist = "no"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist (see ``_XDIST_GROUPS``). Variants that start real workers
    with ``spawn`` run with ``-m slow`` (CI runs both selections). A spawned worker
    imports its modules afresh (torch: 1-3 s on two busy cores); forkserver variants, in
    the default run, already cover objects that reach the workers pickled. Unit tests keep
    every variant: they start workers rarely, and briefly."""
    for item in items:
        group = _XDIST_GROUPS.get(Path(str(item.path)).name)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        callspec = getattr(item, "callspec", None)
        if callspec is None or _UNIT in Path(str(item.path)).parents:
            continue
        methods = {v for v in callspec.params.values() if isinstance(v, str)}
        methods |= set(callspec.id.split("-"))
        forkserver_slow = Path(str(item.path)).name in _FORKSERVER_SLOW
        if "spawn" in methods or ("forkserver" in methods and forkserver_slow):
            item.add_marker(pytest.mark.slow)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The ``torch`` marker: tests of torch's own behaviour (parity, its samplers, its
    process groups) skip, saying so, where torch is not installed."""
    if not _HAVE_TORCH and item.get_closest_marker("torch") is not None:
        pytest.skip("needs torch, which is not installed: pip install torch==2.13.0")


def _conveyor_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("conveyor-")}


@pytest.fixture(autouse=True)
def no_conveyor_thread_left() -> Iterator[None]:
    """Fail a test after which a thread of conveyor's still runs: its loaders are gone, so
    nothing needs it, and every later fork would copy a multi-threaded process.

    This checks conveyor's threads on every Python. The warning Python 3.12+ gives at a
    fork in a process with other threads is checked in a clean process
    (tests/integration/test_fork_safety.py): under the "error" filter CPython drops it,
    so here it would surface only inside ``pytest.warns`` blocks.
    """
    before = _conveyor_threads()
    yield
    if _conveyor_threads() - before:
        gc.collect()  # a loader in a reference cycle (a traceback) closes when collected
    left = sorted(t.name for t in _conveyor_threads() - before)
    assert not left, f"conveyor threads still running after the test: {left}"
