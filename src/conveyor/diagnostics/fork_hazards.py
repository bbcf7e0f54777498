"""The workers' hazards besides open handles: big containers, random generators, CUDA, threads.

Given a :class:`~conveyor.diagnostics.walk.Walk` of the user's objects:

* :func:`container_findings`: Python containers so big that every worker
  ends up with its own copy (``large-python-container``);
* :func:`cuda_findings`: CUDA tensors a forked worker would touch;
* :func:`rng_findings`: random generators made here, which every worker would
  start in the same state (``shared-rng``).

:func:`thread_findings` looks at the process: threads a fork leaves behind. What the
user's open handles and raw descriptors would do in the workers is handle_hazards.py's.
"""

from __future__ import annotations

import functools
import itertools
import random
import sys
import threading
import types
from typing import Any

from .._workers.start_method import StartMethod
from .findings import ENVIRONMENT, Finding, Severity
from .fixes import reseed_fix
from .paths import short_repr, type_name
from .walk import MAX_ITEMS, Walk, within

__all__ = [
    "container_findings",
    "cuda_findings",
    "cuda_initialized",
    "names_used",
    "rng_findings",
    "running_threads",
    "thread_findings",
]

# Threads of the tools around a program (notebook kernels, debuggers, test runners, tqdm's
# monitor) and multiprocessing's queue feeders (whose locks it resets after a fork).
# Threads of tools and training frameworks (Lightning's child-process observer,
# accelerate's, torch.distributed's): the user did not start them and cannot stop them.
_KNOWN_THREAD_MODULES = (
    "conveyor", "multiprocessing.queues", "ipykernel", "IPython", "zmq", "jupyter_client",
    "debugpy", "pydevd", "_pydevd", "_pydevd_bundle", "_pytest", "pytest_timeout", "tqdm",
    "lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "torch.distributed",
    "huggingface_hub", "datasets",
)  # fmt: skip


# --- random generators -----------------------------------------------------------------


def rng_findings(
    walk: Walk, start_method: StartMethod, worker_init_fn: Any = None
) -> list[Finding]:
    """Random generators made in this process: every worker would start in the same state.

    Not the global ones (each worker reseeds those, as torch's do), and not one whose
    name ``worker_init_fn`` uses (it replaces or reseeds it there, as the fix says).
    """
    renewed = names_used(worker_init_fn)
    findings = []
    for path, rng in walk.rngs:
        if _is_global_rng(rng) or path.rsplit(".", 1)[-1] in renewed:
            continue
        if start_method.copies_memory:
            how = "Every forked worker inherits it in the state it has here"
        else:
            how = f"Every {start_method.name} worker unpickles it in the state it has here"
        findings.append(
            Finding(
                code="shared-rng",
                severity=Severity.WARNING,
                where=path,
                what=f"A random generator ({_rng_name(rng)}) would start in the same state in "
                "every worker",
                why=f"{how}, so the workers draw the same numbers: the same augmentations, "
                "crops or noise for different samples. Each worker reseeds Python's random, "
                "NumPy's global generator and torch (as torch's workers do), but not a "
                "generator the dataset holds.",
                fix=reseed_fix(path, _seeded(rng)) + ".",
            )
        )
    return findings


def _is_global_rng(rng: Any) -> bool:
    numpy_global = getattr(sys.modules.get("numpy.random.mtrand"), "_rand", None)
    return rng is numpy_global or rng is getattr(random, "_inst", None)


def _rng_name(rng: Any) -> str:
    kind = type(rng)
    public = kind.__module__.startswith("numpy.random")
    return f"numpy.random.{kind.__name__}" if public else type_name(rng)


def _seeded(rng: Any) -> str:
    """A generator like ``rng`` made from a worker's seed (``info.seed``)."""
    name = _rng_name(rng)
    if name == "numpy.random.Generator":
        return "np.random.default_rng(info.seed)"
    if name == "numpy.random.RandomState":
        return "np.random.RandomState(info.seed % 2**32)"
    return f"{name.replace('numpy.', 'np.', 1)}(info.seed)"


def names_used(func: Any) -> set[str]:
    """The global and attribute names the code of ``func`` (and code nested in it) uses."""
    if isinstance(func, functools.partial):
        func = func.func
    code = getattr(getattr(func, "__func__", func), "__code__", None)
    names: set[str] = set()
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


# --- big containers, threads, CUDA ----------------------------------------------------


def container_findings(walk: Walk, start_method: StartMethod) -> list[Finding]:
    """Python containers so large that every worker ends up with its own copy."""
    findings = []
    for path, obj in walk.containers:
        count, size = _count_and_size(obj)
        if start_method.copies_memory:
            why = (
                "Forked workers share its memory only until they read it: reading an item "
                "updates the item's reference count, which copies its memory page, so every "
                f"worker ends up with its own copy: about {_megabytes(size)} more per worker "
                "over an epoch (it looks like a leak)."
            )
        else:
            why = (
                f"Every {start_method.name} worker unpickles its own copy: about "
                f"{_megabytes(size)} more per worker, and slower start-up."
            )
        array = type(obj).__module__ == "numpy"
        kind = "NumPy array of dtype=object" if array else type(obj).__name__
        fix = "store it as conveyor.SharedList(...), one buffer that workers read without copying"
        fix += (
            ", or as a NumPy array of fixed-size items (np.array(paths) for strings)."
            if array or not isinstance(obj, dict)
            else ", e.g. its keys and its values as two SharedLists (or NumPy arrays)."
        )
        findings.append(
            Finding(
                code="large-python-container",
                severity=Severity.WARNING,
                where=path,
                what=f"A {kind} of {count:,} Python objects would be copied into every worker",
                why=why,
                fix=fix,
            )
        )
    return findings


def _count_and_size(obj: Any) -> tuple[int, int]:
    """Items in ``obj`` and its rough size in bytes (from the first items)."""
    count = int(obj.size) if type(obj).__module__ == "numpy" else len(obj)
    sample: list[Any]
    if isinstance(obj, dict):
        sample = [x for pair in itertools.islice(dict.items(obj), MAX_ITEMS) for x in pair]
        per_item = 2
    else:
        flat = obj.flat if type(obj).__module__ == "numpy" else obj
        sample, per_item = list(itertools.islice(iter(flat), MAX_ITEMS)), 1
    each = sum(sys.getsizeof(x) for x in sample) / max(1, len(sample)) * per_item
    return count, int(sys.getsizeof(obj) + each * count)


def _megabytes(size: int) -> str:
    return f"{size / 2**20:,.0f} MB" if size >= 2**20 else f"{size / 2**10:,.0f} KB"


def running_threads() -> list[threading.Thread]:
    """Threads a fork would leave behind: not this one, the main one, or known tools' ones.

    Threads that C code registered with Python (``_DummyThread``) are not counted:
    they never leave ``threading.enumerate()``, so it cannot tell whether they still run.
    """
    skip = {threading.current_thread(), threading.main_thread()}
    found = []
    for thread in threading.enumerate():
        if thread in skip or isinstance(thread, threading._DummyThread):
            continue
        owner = type(thread).__module__
        # Read once: a thread ending meanwhile drops it (a second read found none, and
        # the ending feeder thread of torch's last loader was taken for a stranger's).
        target = getattr(thread, "_target", None)
        if type(thread) is threading.Thread and target is None:
            continue  # its target has returned (Thread.run drops it): it is ending
        if owner == "threading":  # a plain Thread: whoever wrote its target started it
            owner = getattr(target, "__module__", None) or owner
        if not within(str(owner), _KNOWN_THREAD_MODULES):
            found.append(thread)
    return found


def thread_findings() -> list[Finding]:
    threads = running_threads()
    if not threads:
        return []
    names = ", ".join(repr(t.name) for t in threads[:5]) + (", ..." if len(threads) > 5 else "")
    count = f"{len(threads)} other thread" + ("s are" if len(threads) > 1 else " is")
    return [
        Finding(
            code="parent-threads",
            severity=Severity.WARNING,
            where=ENVIRONMENT,
            what=f"{count} running in this process ({names}) when the workers are forked",
            why="fork copies only the calling thread: a lock another thread holds at that "
            "moment (in logging, an HTTP client, a C library) stays locked forever in the "
            "worker, which then hangs.",
            fix="use multiprocessing_context='forkserver' or 'spawn', or start those threads "
            "after the workers (with persistent_workers=True they are forked only once).",
        )
    ]


def cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # torch is never imported just to ask
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def cuda_findings(walk: Walk, *, full: bool) -> list[Finding]:
    """Under fork: CUDA tensors the workers would touch (ERROR); CUDA in use at all (INFO)."""
    if not cuda_initialized():
        return []
    fix = "use multiprocessing_context='spawn' or 'forkserver'"
    for path, tensor in walk.tensors:
        if getattr(tensor, "is_cuda", False) is True:
            return [
                Finding(
                    code="cuda-before-fork",
                    severity=Severity.ERROR,
                    where=path,
                    what=f"A CUDA tensor (shape {short_repr(tuple(tensor.shape))} on "
                    f"{tensor.device}) would be used by forked workers",
                    why="CUDA is initialized in this process and cannot be used in a forked "
                    "child: the worker fails with 'Cannot re-initialize CUDA in forked "
                    "subprocess'.",
                    fix=f"{fix}, or keep the dataset's tensors on the CPU and move each batch "
                    "to the GPU in the training loop.",
                )
            ]
    if not full:
        return []
    return [
        Finding(
            code="cuda-before-fork",
            severity=Severity.INFO,
            where=ENVIRONMENT,
            what="CUDA is initialized in this process and the workers are forked",
            why="That is fine while the workers only use the CPU; a dataset or transform "
            "that uses CUDA in a worker fails with 'Cannot re-initialize CUDA in forked "
            "subprocess'.",
            fix=f"if the workers must use CUDA, {fix}.",
        )
    ]
