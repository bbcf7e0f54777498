"""Iterators refuse pickling, with torch's exception type."""

from __future__ import annotations

from typing import NoReturn


class Unpicklable:
    """A loader's iterator holds workers, pipes, threads and a pass over the sampler: a
    copy of it could not run. torch's iterators raise ``NotImplementedError`` when
    pickled or deep-copied, and code written for torch (Lightning saving a trainer,
    ``ddp_spawn``) expects that type; conveyor's do the same, and say what to do."""

    def __getstate__(self) -> NoReturn:
        raise NotImplementedError(
            f"{type(self).__name__} cannot be pickled (nor deep-copied): it is a pass over a "
            "DataLoader, with its workers. Pickle the DataLoader itself (a copy starts a "
            "fresh epoch), or its state_dict() to resume where this pass is."
        )
