"""What the user's open handles would do in the workers: the ``shared-*``, ``unpicklable``,
``file-copied`` and ``raw-fd`` findings.

Given a :class:`~conveyor.diagnostics.walk.Walk` of the user's objects:

* :func:`handle_findings`: open files, SQLite connections, sockets, LMDB environments
  and h5py objects, shared by forked workers (``shared-*``), or under spawn/forkserver
  not picklable (``unpicklable``) or, for a text file open for reading, sent as a frozen
  copy (``file-copied``);
* :func:`descriptor_findings`: raw file descriptors (ints from ``os.open``), which mean
  nothing in a spawn or forkserver worker (``raw-fd``).

:func:`handle_what` names a handle the same way in every finding, thread workers' too.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

from .._workers.start_method import StartMethod
from .findings import Finding, Severity
from .fixes import fix_for, per_worker_fix
from .handles import Handle, describe_descriptor, describe_handle
from .paths import type_name
from .pickling import why_unpicklable
from .walk import Walk

__all__ = ["descriptor_findings", "handle_findings", "handle_what"]


_FORK_WHY = {
    "file": "Forked workers inherit one file descriptor and share its file offset: workers "
    "that seek and read at the same time read each other's bytes, so samples come back "
    "silently wrong.",
    "sqlite": "A SQLite connection must not cross a fork: the workers share its file "
    "descriptors and lock state, so reads fail with 'database disk image is malformed' and "
    "a write can corrupt the database.",
    "socket": "Every worker reads and writes the same connection: requests interleave and a "
    "worker receives another worker's reply.",
    "lmdb": "An LMDB environment must not be used after fork: the workers share its lock "
    "table and transaction state, and reads fail or return stale data.",
    "hdf5": "The HDF5 library under h5py is not fork-safe: the workers share the file "
    "descriptor and the library's caches, and reads return wrong data or fail.",
}
_FORK_CODES = {
    "file": "shared-file-handle",
    "sqlite": "shared-sqlite",
    "socket": "shared-socket",
    "lmdb": "shared-lmdb",
    "hdf5": "shared-hdf5",
}
_WHAT = {
    "file": "An open file",
    "sqlite": "A SQLite connection",
    "socket": "An open socket",
    "lmdb": "An open LMDB environment",
    "hdf5": "An open HDF5 (h5py) object",
    "fd": "A raw file descriptor",
}


def handle_findings(walk: Walk, start_method: StartMethod) -> list[Finding]:
    """The open handles in ``walk``: shared by forked workers, or not sendable to others."""
    findings = []
    for path, obj in walk.handles:
        handle = describe_handle(obj)
        if handle is None:
            continue
        if start_method.copies_memory:
            finding = _fork_finding(path, handle)
        else:
            finding = _pickled_finding(path, obj, handle, start_method.name)
        if finding is not None:
            findings.append(finding)
    return findings


def handle_what(handle: Handle) -> str:
    """``An open file ('/data/x.bin', mode 'rb')``: a handle for a finding's first words."""
    return _WHAT[handle.kind] + (f" ({handle.label})" if handle.label else "")


def _fork_finding(path: str, handle: Handle) -> Finding | None:
    if not handle.backed_by_file:
        return None  # each child gets its own copy of an in-memory database
    why = _FORK_WHY[handle.kind]
    if handle.writes:
        why += " Data buffered before the fork is written again by every worker."
    severity = Severity.ERROR if handle.kind == "sqlite" else Severity.WARNING
    return Finding(
        code=_FORK_CODES[handle.kind],
        severity=severity,
        where=path,
        what=f"{handle_what(handle)} would be shared by the forked workers",
        why=why,
        fix=per_worker_fix(path, handle),
    )


def _pickled_finding(path: str, obj: Any, handle: Handle, start_method: str) -> Finding | None:
    if handle.copied_by_cloudpickle:
        return Finding(
            code="file-copied",
            severity=Severity.WARNING,
            where=path,
            what=f"{handle_what(handle)} would reach the {start_method} workers as a copy of its "
            "contents",
            why="cloudpickle sends a text file open for reading as an in-memory copy of the "
            "whole file: each worker gets a frozen snapshot, not the file, and a large file "
            "is read and copied once per worker.",
            fix=per_worker_fix(path, handle),
        )
    try:
        cloudpickle.dumps(obj)
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
    else:
        return None
    return Finding(
        code="unpicklable",
        severity=Severity.ERROR,
        where=path,
        what=f"{handle_what(handle)} cannot be sent to the {start_method} workers",
        why=why_unpicklable(path, type_name(obj), reason),
        fix=fix_for(path, type_name(obj), handle) + ".",
    )


def descriptor_findings(walk: Walk, start_method: StartMethod) -> list[Finding]:
    """Raw descriptors (ints named like one, open here) that a spawn or forkserver worker
    would receive as a bare number. A forked worker inherits the descriptor itself."""
    if start_method.copies_memory:
        return []
    findings = []
    for path, fd in walk.descriptors:
        handle = describe_descriptor(fd)
        if handle is None:
            continue  # not open here: just a number
        findings.append(
            Finding(
                code="raw-fd",
                severity=Severity.WARNING,
                where=path,
                what=f"{handle_what(handle)} would reach the {start_method.name} workers as a bare "
                "number",
                why=f"{path} is the int {fd}, a descriptor open in this process only. A "
                f"{start_method.name} worker does not inherit it: there {fd} is closed "
                "(OSError: [Errno 9] Bad file descriptor) or is another file the worker "
                "opened, and reads and writes go to the wrong file.",
                fix=per_worker_fix(path, handle),
            )
        )
    return findings
