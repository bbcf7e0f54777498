"""The ``Stateful`` protocol: objects that can save and restore their own progress.

torchdata's ``StatefulDataLoader`` calls ``state_dict()`` / ``load_state_dict()``
on the dataset, the sampler, the batch sampler and their iterators when they
define both; conveyor does the same, so code written for it works unchanged.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol, runtime_checkable

__all__ = ["Stateful", "is_stateful", "load_into", "save_of"]


@runtime_checkable
class Stateful(Protocol):
    """A dataset, sampler or iterator that saves its progress and resumes from it.

    Defining both methods is enough (``isinstance(obj, Stateful)`` holds without
    inheriting): the loader saves their states in its ``state_dict()`` and hands them
    back on resume.
    """

    def state_dict(self) -> dict[str, Any]:
        """Where it is, as plain data (a copy: later progress must not change it)."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from what ``state_dict()`` returned."""
        ...


def is_stateful(obj: Any) -> bool:
    """Both methods defined (a class need not inherit ``Stateful``)."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def save_of(obj: Any) -> Any:
    """``obj.state_dict()`` copied (later progress must not change a snapshot), or None."""
    if not is_stateful(obj):
        return None
    return copy.deepcopy(obj.state_dict())


def load_into(obj: Any, state: Any) -> None:
    """``obj.load_state_dict(state)`` when there is a state and ``obj`` takes one."""
    if state is not None and is_stateful(obj):
        obj.load_state_dict(state)
