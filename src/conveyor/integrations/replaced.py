"""Say so when accelerate replaces conveyor's loading with torch's.

``Accelerator.prepare`` builds a *torch* ``DataLoader`` from a loader's attributes
(inside its ``DataLoaderShard``; accelerate 1.15 names torch's class, or torchdata's
``StatefulDataLoader``, never the loader's own): handed a conveyor loader, it keeps
the dataset and torch's arguments, and torch's workers load the data, without a
word. accelerate has no hook for the class it builds. The one moment conveyor sees
is accelerate asking whether the loader was prepared already (the first thing
``Accelerator.prepare_data_loader`` reads): :class:`AcceleratePrepared` answers as
the plain attribute would, and warns once per loader, unless conveyor's own
integration (``conveyor.integrations.accelerate``) is the one preparing it.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from conveyor.errors import LoaderReplacedWarning

__all__ = ["AcceleratePrepared", "prepared_by_conveyor"]

_PREPARED = "_conveyor_accelerate_prepared"  # what accelerate set (True once prepared)
_OURS = "_conveyor_prepares"  # conveyor's integration is preparing it: it stays conveyor's
_WARNED = "_conveyor_warned_replaced"


class AcceleratePrepared:
    """The loader's ``_is_accelerate_prepared``: what accelerate set, else False."""

    def __get__(self, loader: Any, owner: type | None = None) -> Any:
        if loader is None:
            return self
        state = loader.__dict__
        prepared = state.get(_PREPARED, False)
        quiet = prepared or state.get(_OURS) or state.get(_WARNED)
        if not quiet and _from_accelerate() and not _accelerate_builds_conveyors():
            state[_WARNED] = True
            warnings.warn(_message(loader), LoaderReplacedWarning, stacklevel=_callers_level())
        return prepared

    def __set__(self, loader: Any, value: Any) -> None:
        loader.__dict__[_PREPARED] = value


@contextlib.contextmanager
def prepared_by_conveyor(loader: Any) -> Iterator[None]:
    """accelerate prepares ``loader`` for conveyor's integration, which keeps conveyor
    loading: nothing to warn about. (Nested: conveyor's prepare() with its Accelerator.)"""
    state = loader.__dict__
    depth = state.get(_OURS, 0)
    state[_OURS] = depth + 1
    try:
        yield
    finally:
        state[_OURS] = depth


def _message(loader: Any) -> str:
    changed = _changed_options(loader)
    options = f"conveyor's options ({changed}) and " if changed else ""
    return (
        "accelerator.prepare() is replacing this conveyor DataLoader with a torch DataLoader "
        "built from its attributes: torch's workers will load the data, without "
        f"{options}conveyor's handling of failures (restarted workers, errors that name the "
        "sample, exact resume with state_dict). accelerate builds torch's class whatever "
        "loader it is given. Fix (one line): create the accelerator with conveyor's "
        "subclass, whose prepare() keeps conveyor loading: `from "
        "conveyor.integrations.accelerate import Accelerator`; or prepare this loader with "
        "`loader = conveyor.integrations.accelerate.prepare(accelerator, loader)`."
    )


def _changed_options(loader: Any) -> str:
    """conveyor's options that differ from their defaults: ``on_error='skip', ...``."""
    parameters = inspect.signature(type(loader).__init__).parameters
    changed = [
        f"{name}={getattr(loader, name)!r}"
        for name in type(loader).conveyor_options
        if name in parameters and getattr(loader, name) != parameters[name].default
    ]
    return ", ".join(changed)


def _from_accelerate() -> bool:
    """Whether accelerate itself asks (not a debugger or a tool listing attributes)."""
    return str(sys._getframe(2).f_globals.get("__name__", "")).startswith("accelerate.")


def _accelerate_builds_conveyors() -> bool:
    """accelerate's name ``DataLoader`` is conveyor's class (code that put conveyor in
    torch's place before importing accelerate, as tools/accelerate_suite.py does): then
    nothing is replaced."""
    built = getattr(sys.modules.get("accelerate.data_loader"), "DataLoader", None)
    mro = getattr(built, "__mro__", ())
    return any(kind.__module__ == "conveyor.loader" for kind in mro)


def _callers_level() -> int:
    """The ``stacklevel`` that points at the user's code: the first frame outside
    conveyor and accelerate (their ``accelerator.prepare(...)`` line)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(
        ("conveyor.", "accelerate.")
    ):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level
