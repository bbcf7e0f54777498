"""Code pickled by value for spawn and forkserver workers keeps its file name and, for a
notebook cell, its source: here the pickling alone, in one process. The real trip, under
every start method, from a script, a cell and ``python -``, is in
``tests/faults/test_worker_errors.py``."""

from __future__ import annotations

import hashlib
import linecache
import pickle
import traceback
from collections.abc import Iterator

import pytest

from conveyor._workers.user_objects import _dumps

SOURCE = "def parse(text):\n    return int(text)  # line 2 of the cell\n"
CELL = f"<ipython-input-3-{hashlib.sha1(SOURCE.encode()).hexdigest()[:12]}>"


@pytest.fixture
def parse_from_a_cell() -> Iterator[object]:
    """A function defined as IPython runs a cell: source in linecache, no file."""
    linecache.cache[CELL] = (len(SOURCE), None, SOURCE.splitlines(keepends=True), CELL)
    namespace = {"__name__": "__main__"}  # not importable by name: it goes by value
    exec(compile(SOURCE, CELL, "exec"), namespace)
    try:
        yield namespace["parse"]
    finally:
        linecache.cache.pop(CELL, None)


def test_a_cells_function_keeps_its_name_line_and_source(parse_from_a_cell: object) -> None:
    data = _dumps(parse_from_a_cell)
    del linecache.cache[CELL]  # as in a spawned worker: the cell's lines are not there
    parse = pickle.loads(data)

    with pytest.raises(ValueError) as info:
        parse("x")

    frame = traceback.format_exception(info.value)[-2].splitlines()
    assert frame[:2] == [
        f'  File "{CELL}", line 2, in parse',
        "    return int(text)  # line 2 of the cell",
    ]


def test_a_files_function_keeps_its_file_name_and_sends_no_source() -> None:
    namespace = {"__name__": "__main__"}
    exec(compile("def answer():\n    return 42\n", __file__, "exec"), namespace)
    data = _dumps(namespace["answer"])

    assert pickle.loads(data).__code__.co_filename == __file__
    assert b"return 42" not in data  # the worker reads the file itself
