"""A child program for the worker-traceback tests: user code in ``__main__`` that fails in
a worker, defined where users define it.

Usage: ``python worker_tracebacks.py START_METHOD ORIGIN``, or with ``ORIGIN`` ``stdin``,
``python - START_METHOD stdin < worker_tracebacks.py``. ``ORIGIN`` says where the code
between the ``user code`` markers comes from:

- ``script``: this file, run as a training script is;
- ``cell``: a notebook cell: as IPython runs one, the block is registered in
  ``linecache`` under a cell name (``<ipython-input-N-HASH>``, no file behind it) and
  compiled under that name into ``__main__``;
- ``stdin``: the program read from standard input (``python -``): no source anywhere.

A loader meets an error in the dataset's ``__getitem__`` (a class) and one in the
``collate_fn`` (a function); the program prints one JSON line, each error's worker
traceback as the note has it, and checks that nothing is left behind.
"""

from __future__ import annotations

import hashlib
import json
import linecache
import sys

from tests.helpers.leaks import no_leaks

from conveyor import DataLoader


# --- user code ---
class Scans:
    def __len__(self):
        return 6

    def __getitem__(self, index):
        if index == 3:
            raise ValueError(f"scan {index} is corrupt")
        return index


def stack_labels(batch):
    if 4 in batch:
        raise LookupError(f"no label for {batch}")
    return batch


# --- end of user code ---


def run_as_a_cell(number: int) -> str:
    """Define the user code as IPython does a cell's; the cell's name."""
    with open(__file__) as script:
        text = script.read()
    start = text.index("# --- user code ---\n") + len("# --- user code ---\n")
    cell = text[start : text.index("# --- end of user code ---")]
    name = f"<ipython-input-{number}-{hashlib.sha1(cell.encode()).hexdigest()[:12]}>"
    linecache.cache[name] = (len(cell), None, cell.splitlines(keepends=True), name)
    exec(compile(cell, name, "exec"), sys.modules["__main__"].__dict__)
    return name


def worker_traceback(loader: DataLoader, error: type[Exception]) -> str:
    try:
        for _ in loader:
            pass
    except error as exc:
        notes = getattr(exc, "__notes__", [])
        return str(notes[-1]) if notes else "(no note)"
    return "(nothing raised)"


def main() -> None:
    method, origin = sys.argv[1], sys.argv[2]
    where = run_as_a_cell(7) if origin == "cell" else None
    user = sys.modules["__main__"].__dict__
    with no_leaks():
        in_dataset = worker_traceback(
            DataLoader(
                user["Scans"](), batch_size=2, num_workers=1, multiprocessing_context=method
            ),
            ValueError,
        )
        in_collate = worker_traceback(
            DataLoader(
                list(range(6)),
                batch_size=2,
                num_workers=1,
                multiprocessing_context=method,
                collate_fn=user["stack_labels"],
            ),
            LookupError,
        )
    print(json.dumps({"cell": where, "dataset": in_dataset, "collate": in_collate}), flush=True)


if __name__ == "__main__":
    main()
