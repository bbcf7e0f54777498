"""What both iterators show code written for torch's iterators, beyond iteration.

torch's ``_BaseDataLoaderIter`` refuses to be pickled (or deep-copied) with a
``NotImplementedError``; code that copies a training state (a framework saving
everything it holds, a ``copy.deepcopy`` of a wrapper) catches that type. conveyor's
iterators hold workers and the epoch's place, which a copy could not share either: they
refuse the same way, naming what to pickle instead.
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["IteratorFace"]


class IteratorFace:
    def __getstate__(self) -> NoReturn:
        raise NotImplementedError(
            f"{type(self).__name__} cannot be pickled, as torch's DataLoader iterators cannot: "
            "it holds the loader's workers and its place in the epoch. Pickle (or copy) the "
            "DataLoader itself, whose next iter() starts afresh, or save "
            "loader.state_dict() to resume at this batch."
        )
