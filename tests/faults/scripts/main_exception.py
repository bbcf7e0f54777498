"""A child program for the worker-error tests: exception classes of a training script.

Usage: ``python main_exception.py START_METHOD``. Run as ``__main__``, as a training
script is: ``CorruptSample`` is defined here at top level, ``LocalError`` in a
function (importable nowhere). A loader with two workers meets both; the script
prints one JSON line: the first batch, then how each error came back (each note's
first line only).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from conveyor import DataLoader
from conveyor.errors import add_note  # exc.add_note, also on Python 3.10


class CorruptSample(Exception):
    """What a training script raises for a sample it cannot read."""


def _local_error_class() -> type[Exception]:
    class LocalError(Exception):
        pass

    return LocalError


class Samples:
    """Batches of two: [2, 3] raises ``CorruptSample``, [4, 5] ``LocalError``."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> int:
        if index == 3:
            error = CorruptSample(f"sample {index} is corrupt")
            add_note(error, "noted in __getitem__")
            raise error
        if index == 5:
            local = _local_error_class()(f"local {index}")
            add_note(local, "noted in __getitem__")
            raise local
        return index


def _report(exc: BaseException, caught_by_except: bool) -> dict[str, Any]:
    return {
        "caught_by_except": caught_by_except,
        "same_class": type(exc) is CorruptSample,
        "isinstance": isinstance(exc, CorruptSample),
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "notes": [note.splitlines()[0] for note in getattr(exc, "__notes__", [])],
    }


def main() -> None:
    loader = DataLoader(Samples(), batch_size=2, num_workers=2, multiprocessing_context=sys.argv[1])
    outcomes: list[Any] = []
    it = iter(loader)
    for _ in range(3):
        try:
            outcomes.append(next(it).tolist())
        except CorruptSample as exc:
            outcomes.append(_report(exc, caught_by_except=True))
        except Exception as exc:  # the class came back as another one
            outcomes.append(_report(exc, caught_by_except=False))
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    main()
