"""The fix for a part that cannot go to the workers as it is: one recipe wherever it is told.

``conveyor.check()``, the automatic pre-flight and the ``UnpicklableError`` raised
at ``iter()`` all ask :func:`fix_for`. An open handle that can be opened again
gets the precise recipe (:func:`per_worker_fix`: ``conveyor.per_worker(open,
'/data/train.bin', 'rb')``, placed where the handle was); anything else gets the
fix for its type.
"""

from __future__ import annotations

import re

from .handles import Handle

__all__ = ["fix_for", "per_worker_fix", "reseed_fix", "sharing_is_a_hazard"]

_LAZY = "in each worker (in __getitem__ or worker_init_fn) instead of in __init__"
_FILE_FIX = (
    "store conveyor.per_worker(open, path) instead: it opens the file lazily, once in each "
    "worker, and pickles as the recipe"
)
_CONNECTION_FIX = (
    "store conveyor.per_worker(<function that opens it>, <its arguments>) instead, e.g. "
    "conveyor.per_worker(sqlite3.connect, path): it connects lazily, once in each worker, "
    "and pickles as the recipe"
)
_BY_TYPE = {  # words in the lowercased type name -> fix; the first match wins
    "_io. tempfile. file": _FILE_FIX,
    "_thread. threading. synchronize. lock": f"create it lazily {_LAZY}",
    "generator coroutine iterator": "create it where it is consumed (in __iter__ or __getitem__)",
    "builtins.function builtins.type": "define it at module level (importable by name)",
    "sqlite3. socket ssl. connection cursor session client engine": _CONNECTION_FIX,
}
_DEFAULT_FIX = (
    f"create it lazily {_LAZY}, or drop it in __getstate__ and rebuild it in __setstate__"
)
_NOUN = {
    "sqlite": "connection",
    "socket": "connection",
    "lmdb": "environment",
    "hdf5": "file",
    "fd": "file descriptor",
}
# A function's own variable: the last step of collate_fn.<default 'fh'>, ...<closure var 'fh'>.
_VARIABLE = re.compile(r"(?P<owner>.*)\.<(?P<what>closure var|default|global) '(?P<name>\w+)'>")


def fix_for(path: str, type_name: str, handle: Handle | None = None) -> str:
    """The fix for the part at ``path`` (no final period): the precise per-worker recipe
    for a handle that can be opened again, else the fix for its type."""
    if handle is not None and handle.reopens:
        return per_worker_fix(path, handle).removesuffix(".")
    return _by_type(type_name)


def sharing_is_a_hazard(type_name: str, handle: Handle | None = None) -> bool:
    """Whether forked workers may not share it (a handle): then fork is no way out."""
    return handle is not None or _by_type(type_name) in (_FILE_FIX, _CONNECTION_FIX)


def per_worker_fix(path: str, handle: Handle) -> str:
    """How to open the handle at ``path`` in each worker with :func:`conveyor.per_worker`."""
    made = f"conveyor.per_worker({handle.recipe or '<function that opens it>, <its arguments>'})"
    then = f"each worker then opens its own {_NOUN.get(handle.kind, 'file')} on first use."
    variable = _VARIABLE.fullmatch(path)
    if variable is not None:
        owner, what, name = variable.group("owner", "what", "name")
        place = {
            "default": f"make {made} the default of {name} in {owner}",
            "closure var": f"bind {made} to {name} (a variable {owner} closes over)",
            "global": f"store {made} in the global {name} ({owner} reads it)",
        }[what]
        return f"{place} instead, and call {name}.get() where it is used: {then}"
    if any(mark in path for mark in ("<", "(", ".__")):
        # Nowhere to assign it: a set's member, a method's __self__, a pickled form's part.
        return f"store {made} instead of the handle at {path}, and call .get() on it: {then}"
    where = " (in __getitem__)" if re.match(r"dataset\b", path) else ""
    return f"store {made} in {path} instead, and call {path}.get() where it is used{where}: {then}"


def reseed_fix(path: str, seeded: str) -> str:
    """How to give each worker its own random generator in place of the one at ``path``;
    ``seeded`` makes one from the worker's seed, e.g. ``np.random.default_rng(info.seed)``."""
    lazily = "or create it lazily in the worker (on first use, in __getitem__)"
    if re.fullmatch(r"dataset(\.\w+)+", path):
        return (
            f"seed it in each worker: in worker_init_fn, info = conveyor.get_worker_info(); "
            f"info.{path} = {seeded} (info.dataset is that worker's copy of the dataset), {lazily}"
        )
    return (
        f"make a new one in each worker from its seed: {seeded} in worker_init_fn, with "
        f"info = conveyor.get_worker_info(), {lazily}"
    )


def _by_type(type_name: str) -> str:
    name = type_name.lower()
    hits = (fix for words, fix in _BY_TYPE.items() if any(w in name for w in words.split()))
    return next(hits, _DEFAULT_FIX)
