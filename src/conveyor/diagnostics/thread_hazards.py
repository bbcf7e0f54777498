"""What thread workers (``worker_method="thread"``) would share, and what breaks when they do.

Each thread worker gets a shallow copy of the dataset: its attributes are the very
objects the training process holds. Nothing is pickled or forked, so the process
checks (``shared-*`` under fork, ``unpicklable`` under spawn) do not apply; these do:

* ``thread-shared-file``: one file object, one file position for every thread, so a
  seek in one thread and a read in another return the wrong bytes without an error;
* ``thread-sqlite``: a SQLite connection made with ``check_same_thread=True`` (the
  default) refuses every other thread, so each sample would raise ``ProgrammingError``;
* ``thread-shared-socket``: requests and replies of several threads interleave;
* ``thread-shared-rng``: a generator the dataset holds is drawn from by every thread in
  whatever order they run, so augmentations change from run to run;
* ``thread-torch-rng``: objects known to draw from torch's global generator (torchvision's
  random transforms: see .torch_draws), one per process, which threads cannot each have.

``random``'s and NumPy's module functions need no check: each thread worker draws from
its own stand-ins (conveyor._workers.thread_draws). A bare ``torch.rand`` in ``__getitem__``
cannot be told from what the dataset holds; docs/guide.md says to draw from
``get_worker_info().rng`` instead.
"""

from __future__ import annotations

import threading
from typing import Any

from .findings import Finding, Severity
from .fixes import per_worker_fix
from .fork_hazards import names_used
from .handle_hazards import handle_what
from .handles import Handle, describe_handle
from .walk import Walk

__all__ = ["thread_hazard_findings", "torch_draw_findings"]

_WHY = {
    "file": "Every thread worker reads through this one file object, so they share its "
    "position: a seek in one thread and a read in another return each other's bytes, and "
    "samples come back silently wrong.",
    "socket": "Every thread worker sends and receives on this one connection: requests "
    "interleave and a thread receives another thread's reply.",
    "sqlite": "It was made with check_same_thread=True (SQLite's default), so it refuses every "
    "thread but the one that made it: each sample would raise sqlite3.ProgrammingError.",
}
_CODES = {
    "file": "thread-shared-file",
    "socket": "thread-shared-socket",
    "sqlite": "thread-sqlite",
}
_RNG_FIX = (
    "draw from the thread's own generators instead: info = conveyor.get_worker_info(); "
    "info.rng.numpy_generator (or random_generator, torch_generator) in __getitem__, seeded "
    "as process workers are and reseeded with them"
)
_TORCH_WHY = (
    "torch has one global generator per process, and torch.rand, torch.randint or "
    "Tensor.uniform_ without generator= draw from it: the thread workers take turns on it in "
    "whatever order they happen to run, so the augmentations a sample gets change from run "
    "to run and differ from torch's loader (reseed cannot make them repeat). Each thread "
    "worker has its own random and np.random, but torch's generator cannot be split."
)
_TORCH_FIX = (
    "use worker processes of one thread each (worker_method='multiprocessing' and "
    "threads_per_worker=1, the defaults), whose draws are torch's; or give the transform the "
    "worker's own torch generator, e.g. class RandomFlip: def __call__(self, img): info = "
    "torch.utils.data.get_worker_info(); g = info.rng.torch_generator if info and info.rng "
    "else None; return img.flip(-1) if torch.rand(1, generator=g) < 0.5 else img (seeded as "
    "a process worker's torch generator is, and reseeded with it)."
)
_NAMED = 3  # objects named in the message; the rest are counted


def thread_hazard_findings(walk: Walk, worker_init_fn: Any = None) -> list[Finding]:
    """What the thread workers would share in ``walk``'s objects, worst first."""
    findings = [f for path, obj in walk.handles if (f := _handle_finding(path, obj))]
    findings += torch_draw_findings(walk)
    renewed = names_used(worker_init_fn)
    for path, _ in walk.rngs:
        if path.rsplit(".", 1)[-1] in renewed:
            continue  # worker_init_fn gives each thread's dataset copy its own
        findings.append(
            Finding(
                code="thread-shared-rng",
                severity=Severity.WARNING,
                where=path,
                what="A random generator would be shared by all the thread workers",
                why="The threads draw from it in whatever order they happen to run, so the "
                "augmentations a sample gets change from run to run and with num_workers "
                "(reseed cannot make them repeat).",
                fix=_RNG_FIX + ".",
            )
        )
    return sorted(findings, key=lambda f: -f.severity)


def torch_draw_findings(walk: Walk) -> list[Finding]:
    """One finding for everything in ``walk`` that draws from torch's global generator."""
    if not walk.torch_draws:
        return []
    named = [f"{path} is {_a(what)}" for path, _, what in walk.torch_draws[:_NAMED]]
    more = len(walk.torch_draws) - _NAMED
    if more > 0:
        named.append(f"{more} more such object{'s' if more > 1 else ''}")
    listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return [
        Finding(
            code="thread-torch-rng",
            severity=Severity.WARNING,
            where=walk.torch_draws[0][0],
            what=f"{listed}, which draw{'s' if len(walk.torch_draws) == 1 else ''} from "
            "torch's global random generator: one per process, shared by the thread workers",
            why=_TORCH_WHY,
            fix=_TORCH_FIX,
        )
    ]


def _a(what: str) -> str:
    return what if what.startswith("a ") else f"a {what}"


def _handle_finding(path: str, obj: Any) -> Finding | None:
    handle = describe_handle(obj)
    if handle is None or handle.kind not in _WHY:
        return None  # LMDB and h5py take their own locks; a raw fd has no position object
    if handle.kind == "sqlite" and not _refuses_other_threads(obj):
        return None  # check_same_thread=False: the user chose to share it
    return Finding(
        code=_CODES[handle.kind],
        severity=Severity.ERROR if handle.kind == "sqlite" else Severity.WARNING,
        where=path,
        what=f"{handle_what(handle)} would be shared by the thread workers",
        why=_WHY[handle.kind],
        fix=_fix(path, handle),
    )


def _fix(path: str, handle: Handle) -> str:
    if not handle.backed_by_file:  # per-thread in-memory databases would each be empty
        return (
            "make it with sqlite3.connect(':memory:', check_same_thread=False) to share it "
            "(SQLite then serializes the threads' calls), or fill one database per thread "
            "worker in worker_init_fn (info.dataset is that thread's copy of the dataset)."
        )
    return per_worker_fix(path, handle).replace("each worker", "each thread worker", 1)


def _refuses_other_threads(conn: Any) -> bool:
    """Whether a SQLite connection was made with ``check_same_thread=True``: making a
    cursor (no SQL runs) from a short-lived thread raises ``ProgrammingError`` if so."""
    refused: list[bool] = []

    def probe() -> None:
        try:
            conn.cursor().close()
        except Exception as exc:  # sqlite3.ProgrammingError; a closed one is not our case
            refused.append("thread" in str(exc))
        else:
            refused.append(False)

    thread = threading.Thread(target=probe, name="conveyor-sqlite-probe", daemon=True)
    thread.start()
    thread.join()
    return bool(refused and refused[0])
