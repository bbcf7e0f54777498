"""What ``MODULE:OBJECT`` names: import it and resolve it into a dataset and loader settings."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.config import LoaderConfig
from conveyor.errors import UsageError

__all__ = ["DEFAULT_BATCH_SIZE", "Target", "UsageError", "load_target"]

DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class Target:
    """The dataset to examine, and the loader settings that came with it (a DataLoader's)."""

    dataset: Any
    spec: str
    batch_size: int | None = DEFAULT_BATCH_SIZE
    collate_fn: Callable[[Any], Any] | None = None
    worker_init_fn: Callable[[int], Any] | None = None
    num_workers: int = 0
    start_method: str | None = None
    prefetch_factor: int = 2
    persistent_workers: bool = False
    # What the loader makes on its workers' copies between epochs (conveyor's
    # epoch_calls); None: torch's DataLoader, which makes no call on them.
    epoch_calls: tuple[str, ...] | None = ("set_epoch",)


def load_target(spec: str) -> Target:
    """Import ``MODULE:OBJECT`` (MODULE dotted, or a path to a .py file) and resolve it."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"{spec!r} is not MODULE:OBJECT; write e.g. mydata:train_set, "
            "mypkg.data:make_dataset or path/to/data.py:TrainSet"
        )
    obj = module = _import(module_name)
    for name in attr.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            origin = getattr(module, "__file__", None) or module_name
            raise UsageError(f"module {module_name!r} ({origin}) has no {attr!r}") from None
    return _resolve(obj, spec)


def _import(name: str) -> Any:
    if name.endswith(".py") or "/" in name or os.sep in name:
        path = Path(name).resolve()
        if not path.is_file():
            raise UsageError(f"cannot import {name!r}: there is no file {path}")
        where, name = str(path.parent), path.stem
        loaded = getattr(sys.modules.get(name), "__file__", None)
        if loaded is not None and Path(loaded).resolve() != path:
            raise UsageError(f"cannot import {path}: module {name!r} is already {loaded}")
    else:
        where = os.getcwd()  # as `python -m` does: modules in the current directory
    if where not in sys.path:
        sys.path.insert(0, where)  # spawned workers inherit sys.path: they find it too
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.split(".")[0] == exc.name.split(".")[0]:
            raise UsageError(f"cannot import {name!r}: {exc} (looked in {where})") from None
        raise UsageError(f"cannot import {name!r}: {_user_error(exc)}") from None
    except (Exception, SystemExit) as exc:  # the module's own code failed
        raise UsageError(f"cannot import {name!r}: {_user_error(exc)}") from None


def _user_error(exc: BaseException) -> str:
    """``Type: message``, then the traceback without our frame and importlib's."""
    frames = traceback.extract_tb(exc.__traceback__)[1:]
    frames = [f for f in frames if "importlib" not in f.filename]
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if not frames:
        return head
    return f"{head}\nTraceback (most recent call last):\n{''.join(traceback.format_list(frames))}"


def _torch_loader(obj: Any) -> bool:
    torch_loader = getattr(sys.modules.get("torch.utils.data"), "DataLoader", None)
    return isinstance(torch_loader, type) and isinstance(obj, torch_loader)


def _resolve(obj: Any, spec: str, *, called: bool = False) -> Target:
    """A DataLoader gives its dataset and settings (not its sampler); a dataset is itself;
    anything else callable is called once, with no arguments."""
    config = getattr(obj, "_config", None)
    if isinstance(config, LoaderConfig):  # conveyor's DataLoader: its settings, validated
        return Target(
            dataset=config.dataset,
            spec=spec,
            batch_size=config.batch_size,
            collate_fn=config.collate_fn,
            worker_init_fn=config.worker_init_fn,
            num_workers=config.num_workers,
            start_method=config.start_method.name,
            prefetch_factor=config.prefetch_factor or 2,
            persistent_workers=config.persistent_workers,
            epoch_calls=config.options.epoch_calls,
        )
    if _torch_loader(obj):
        context = obj.multiprocessing_context
        return Target(
            dataset=obj.dataset,
            spec=spec,
            batch_size=obj.batch_size,
            collate_fn=obj.collate_fn,
            worker_init_fn=obj.worker_init_fn,
            num_workers=obj.num_workers,
            start_method=context.get_start_method() if context is not None else None,
            prefetch_factor=obj.prefetch_factor or 2,
            persistent_workers=bool(obj.persistent_workers),
            epoch_calls=None,
        )
    if not isinstance(obj, type) and (hasattr(obj, "__getitem__") or hasattr(obj, "__iter__")):
        return Target(dataset=obj, spec=spec)
    if callable(obj) and not called:
        try:
            made = obj()
        except Exception as exc:
            raise UsageError(f"calling {spec}() failed: {_user_error(exc)}") from None
        return _resolve(made, spec, called=True)
    kind = type(obj)
    raise UsageError(
        f"{spec}{'() returned' if called else ' is'} a {kind.__module__}.{kind.__qualname__}, "
        "not a dataset (__getitem__ or __iter__), a DataLoader, or a function returning one"
    )
