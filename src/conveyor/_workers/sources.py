"""Code sent to a worker by value keeps its file name, and its source where no file has it.

A spawn or forkserver worker receives the user's ``__main__`` classes and functions
(and a notebook's) by value, through cloudpickle. cloudpickle 3.1 renames all such
code ``<dynamic-code>``, so a worker's traceback named neither the user's file nor
the line's text. :func:`code_reducers` puts the real name back, and for code whose
lines Python keeps only in memory (a notebook cell: IPython registers each cell in
``linecache`` under a name like ``<ipython-input-3-...>``) sends those lines along,
so that the worker's traceback shows them. Where no source exists at all (``python
-``), :func:`missing_sources` says so under the traceback.
"""

from __future__ import annotations

import linecache
import os
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["code_reducers", "missing_sources"]

_RENAMED = "<dynamic-code>"  # the name cloudpickle >= 3.1 gives every code object
_WHY_NO_FILE = {
    "<stdin>": "that code was read from standard input (python -), which no file keeps",
    "<string>": "that code was compiled from a string (python -c, exec), which no file keeps",
}

Reduce = Callable[[types.CodeType], tuple[Any, ...]]


def code_reducers(table: Any) -> dict[type, Reduce]:
    """Entries for a cloudpickle pickler's dispatch table: code objects through
    ``table``'s own reducer, with their file name kept and their in-memory source
    attached."""
    base: Reduce = table[types.CodeType]

    def reduce(code: types.CodeType) -> tuple[Any, ...]:
        make, args = base(code)
        if _RENAMED in args:
            at = args.index(_RENAMED)  # co_filename comes before the other names
            args = (*args[:at], code.co_filename, *args[at + 1 :])
        lines = _lines_without_file(code.co_filename)
        if lines is None:
            return make, args
        return _code_with_source, (make, args, code.co_filename, lines)

    return {types.CodeType: reduce}


def _lines_without_file(filename: str) -> list[str] | None:
    """The lines ``linecache`` keeps for ``filename`` when no file on disk backs them
    (an entry with no modification time: a notebook cell, a REPL input)."""
    entry = linecache.cache.get(filename)
    if entry is None or len(entry) != 4 or entry[1] is not None:
        return None
    lines: list[str] = entry[2]  # the same list for every code object of the cell:
    return lines  # pickled once


def _code_with_source(
    make: Callable[..., types.CodeType], args: tuple[Any, ...], filename: str, lines: list[str]
) -> types.CodeType:
    """In the worker: the code object, its source registered as the notebook had it."""
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return make(*args)


def missing_sources(exc: BaseException) -> str:
    """A line for each file of ``exc``'s traceback (and of the exceptions chained to it)
    that has no source to show, saying why; "" when every line was found."""
    names = dict.fromkeys(
        frame.filename
        for error in _chain(exc)
        for frame in _frames(error)
        if not frame.line and not frame.filename.startswith("<frozen ")
    )
    return "".join(f'(No source lines for "{name}": {_why(name)}.)\n' for name in names)


def _why(filename: str) -> str:
    if filename in _WHY_NO_FILE:
        return _WHY_NO_FILE[filename]
    if not os.path.exists(filename):
        return "the worker finds no such file (moved or deleted, or code compiled under that name)"
    return "the file has no such line (it changed since the code was loaded)"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def _frames(exc: BaseException) -> traceback.StackSummary:
    return traceback.extract_tb(exc.__traceback__)
