"""Open resources in the user's objects: which kind, and how to open them again.

:func:`handle_kind` recognises a handle by its type (files, SQLite connections,
sockets, LMDB environments, h5py objects; the last two only if the program
imported their module). :func:`describe_handle` reads what reopening it takes:
the arguments of ``conveyor.per_worker``, e.g. ``open, '/data/train.bin', 'rb'``.

A raw descriptor (an ``int`` from ``os.open``) has no type to tell it by: an int
is one only where its name says so (:func:`descriptor_name`: ``.fd``,
``.out_fd``, ``['fileno']``, ``.descriptor``) and it is open in this process
(:func:`describe_descriptor`), so that ``self.n = 3`` is never one.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from .paths import type_name

__all__ = ["Handle", "describe_descriptor", "describe_handle", "descriptor_name", "handle_kind"]

# One named step of a path (.name, ['name'], .<default 'name'>), and a descriptor's name.
_NAMED_STEP = re.compile(r"\.(\w+)|(?:\.keywords)?\['(\w+)'\]|\.<[a-z ]+ '(\w+)'>")
_DESCRIPTOR = re.compile(r"(?:fd|fileno|descriptor)$", re.IGNORECASE)
_ACCESS = {os.O_RDONLY: "os.O_RDONLY", os.O_WRONLY: "os.O_WRONLY", os.O_RDWR: "os.O_RDWR"}
_NATIVE_HANDLES = (  # (module, classes, kind): looked up only if the program imported the module
    ("sqlite3", ("Connection",), "sqlite"),
    ("socket", ("socket",), "socket"),
    ("lmdb", ("Environment",), "lmdb"),
    ("h5py", ("File", "Group", "Dataset"), "hdf5"),
)


@dataclass(frozen=True)
class Handle:
    """An open resource: its kind, a label for people, and how to open it per worker."""

    kind: str  # "file" | "sqlite" | "socket" | "lmdb" | "hdf5" | "fd"
    label: str  # "'/data/train.bin', mode 'rb'"
    recipe: str  # "open, '/data/train.bin', 'rb'": the arguments of conveyor.per_worker
    copied_by_cloudpickle: bool = False  # a readable text file: pickles as a copy
    writes: bool = False  # a file open for writing: buffered data is duplicated by fork
    backed_by_file: bool = True  # False for an in-memory SQLite database

    @property
    def reopens(self) -> bool:
        """Whether :attr:`recipe` opens the same resource again (not an empty in-memory one)."""
        return bool(self.recipe) and self.backed_by_file


def handle_kind(kind: type) -> str | None:
    """``"file"``, ``"sqlite"``, ``"socket"``, ``"lmdb"`` or ``"hdf5"`` for a handle's type."""
    if issubclass(kind, io.IOBase):
        return "file"
    for module_name, attrs, name in _NATIVE_HANDLES:
        module = sys.modules.get(module_name)  # never imported here: only if the program did
        classes = tuple(c for c in (getattr(module, a, None) for a in attrs) if isinstance(c, type))
        if classes and issubclass(kind, classes):
            return name
    return None


def describe_handle(obj: Any) -> Handle | None:
    """The open handle ``obj`` is, or None when it is closed, in memory or a standard stream
    (or not a handle)."""
    try:
        kind = handle_kind(type(obj))
        if kind == "file":
            return _describe_file(obj)
        if kind == "sqlite":
            return _describe_sqlite(obj)
        if kind == "socket":
            if obj.fileno() == -1:
                return None
            peer = _peer(obj)
            if isinstance(peer, tuple) and len(peer) >= 2:  # an IP address and port
                label = f"connected to {peer[0]}:{peer[1]}"
                return Handle("socket", label, f"socket.create_connection, {peer[:2]!r}")
            return Handle("socket", f"connected to {peer!r}" if peer else "", "")
        if kind == "lmdb":
            path = obj.path()  # raises once closed
            return Handle("lmdb", repr(path), f"lmdb.open, {path!r}, readonly=True, lock=False")
        if kind == "hdf5":
            if not obj:  # h5py objects are false once closed
                return None
            path = obj.file.filename
            return Handle("hdf5", repr(path), f"h5py.File, {path!r}, 'r'")
    except Exception:
        return None
    return None


def descriptor_name(suffix: str) -> bool:
    """Whether the last step of a path (``.fd``, ``['out_fd']``, ``.<default 'fileno'>``)
    names a file descriptor: its name ends with fd, fileno or descriptor."""
    step = _NAMED_STEP.fullmatch(suffix)
    return step is not None and _DESCRIPTOR.search(step.group(step.lastindex or 0)) is not None


def describe_descriptor(fd: int) -> Handle | None:
    """The file descriptor ``fd`` if it is open in this process and not a standard stream."""
    if fd < 3:
        return None
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)  # raises for a closed descriptor
    except (OSError, ValueError, OverflowError):
        return None
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")  # Linux: the path, or 'pipe:[123]'
    except OSError:
        target = ""
    if not (target.startswith("/") and os.path.isfile(target)):
        return Handle("fd", f"fd {fd}" + (f", {target}" if target else ""), "")
    access = _ACCESS.get(flags & os.O_ACCMODE, "os.O_RDONLY")
    recipe = f"os.open, {target!r}, {access}, close=os.close"
    return Handle("fd", f"fd {fd}, {target!r}", recipe, writes=access != "os.O_RDONLY")


def _describe_file(obj: Any) -> Handle | None:
    if obj.closed or obj.fileno() in (0, 1, 2):  # in-memory files raise in fileno()
        return None
    name, mode = getattr(obj, "name", None), getattr(obj, "mode", None)
    mode = mode if isinstance(mode, str) else "rb"
    opener = "open" if type(obj).__module__ == "_io" else type_name(obj)
    label = f"{name!r}, mode {mode!r}" if isinstance(name, str) else f"fd {obj.fileno()}"
    recipe = f"{opener}, {name!r}, {mode!r}" if isinstance(name, str) else ""
    readable = "r" in mode or "+" in mode
    copied = isinstance(obj, io.TextIOWrapper) and readable and not obj.isatty()
    writes = any(c in mode for c in "wax+")
    return Handle("file", label, recipe, copied_by_cloudpickle=copied, writes=writes)


def _describe_sqlite(conn: Any) -> Handle | None:
    try:
        rows = conn.execute("PRAGMA database_list").fetchall()
    except Exception as exc:  # closed, or made in another thread (check_same_thread)
        if "closed" in str(exc):
            return None
        return Handle("sqlite", "", "sqlite3.connect, path")
    path = next((row[2] for row in rows if row[1] == "main"), "")
    if not path:
        return Handle("sqlite", "in memory", "sqlite3.connect, ':memory:'", backed_by_file=False)
    return Handle("sqlite", repr(path), f"sqlite3.connect, {path!r}")


def _peer(sock: Any) -> Any:
    try:
        return sock.getpeername()
    except OSError:
        return None
