"""One worker's part of a loader's state: its dataset's, and its iterator's.

Shared by the worker loop (which takes and restores it), the in-process
iterator and the state layout, so it lives outside both layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DATASET_STATE = "dataset_state"
FETCHER_STATE = "fetcher_state"
ITER_STATE = "dataset_iter_state"
ENDED = "fetcher_ended"


@dataclass(frozen=True)
class WorkerState:
    """One worker's part: its dataset's state and its iterator's (iterable datasets)."""

    dataset_state: Any = None
    iter_state: Any = None
    ended: bool = False
    iterable: bool = False

    def to_dict(self) -> dict[str, Any]:
        fetcher = {ITER_STATE: self.iter_state, ENDED: self.ended} if self.iterable else None
        return {DATASET_STATE: self.dataset_state, FETCHER_STATE: fetcher}

    @property
    def holds_state(self) -> bool:
        return self.dataset_state is not None or self.iter_state is not None
