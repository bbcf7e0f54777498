"""The loaders a run compares (conveyor, torch, the alternatives), and how each row builds one."""

from __future__ import annotations

import importlib
import multiprocessing
import platform
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from conveyor_bench import alternatives
from conveyor_bench.measure import LoaderFactory, cpu_count_line
from conveyor_bench.options import BenchOptions
from conveyor_bench.rows import ALTERNATIVES, NOT_INSTALLED
from conveyor_bench.specs import WorkloadSpec
from conveyor_bench.workloads import MapDataset

LoaderClass = Callable[..., Iterable[Any]]


@dataclass(frozen=True)
class Loaders:
    classes: dict[str, LoaderClass]
    descriptions: dict[str, str]


def resolve_loaders(options: BenchOptions) -> Loaders:
    classes: dict[str, LoaderClass] = {}
    described: dict[str, str] = {}
    for name in ALTERNATIVES:
        if name in options.chosen_loaders:
            described[name] = alternatives.describe(name)
            if described[name] != NOT_INSTALLED:
                classes[name] = alternatives.LOADERS[name]
    stand_in_torch = options.stand_in_torch
    try:
        torch_loader = importlib.import_module("torch.utils.data").DataLoader
    except ImportError as exc:
        described["torch"] = f"not available ({type(exc).__name__}: {exc})"
    else:
        classes["torch"] = torch_loader
        described["torch"] = "torch.utils.data.DataLoader"
    if stand_in_torch:
        if "torch" in classes:
            classes["conveyor"] = classes["torch"]
        described["conveyor"] = "torch.utils.data.DataLoader (STAND-IN: --stand-in-torch)"
        return Loaders(classes, described)
    try:
        classes["conveyor"] = importlib.import_module("conveyor").DataLoader
    except (ImportError, AttributeError) as exc:
        described["conveyor"] = f"not importable ({type(exc).__name__}: {exc})"
    else:
        described["conveyor"] = "conveyor.DataLoader"
    return Loaders(classes, described)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_environment(loaders: Loaders, torch_threads: str) -> dict[str, str]:
    default_method = multiprocessing.get_context().get_start_method()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.platform()} ({platform.machine()})",
        "cores": cpu_count_line(),
        "python": sys.version.split()[0],
        "conveyor": _version("conveyor"),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "psutil": _version("psutil"),
        "torchvision": _version("torchvision"),
        "conveyor column": loaders.descriptions.get("conveyor", "-"),
        "torch column": loaders.descriptions.get("torch", "-"),
        **{
            f"{name} column": loaders.descriptions[name]
            for name in ALTERNATIVES
            if name in loaders.descriptions
        },
        "default start method": default_method,
        "torch threads in main process": torch_threads,
    }


def loader_factory(
    cls: LoaderClass,
    dataset: MapDataset,
    spec: WorkloadSpec,
    workers: int | str,
    method: str | None,
    extra: dict[str, Any] | None = None,
) -> LoaderFactory:
    kwargs: dict[str, Any] = {"batch_size": spec.batch_size, **(extra or {})}
    if spec.collate_fn is not None:
        kwargs["collate_fn"] = spec.collate_fn
    if cls in alternatives.LOADERS.values():  # their own arguments: see alternatives.py
        kwargs.update(num_workers=workers, multiprocessing_context=method)
        return lambda: cls(dataset, **kwargs)
    kwargs["shuffle"] = False
    if workers:
        kwargs.update(num_workers=workers, persistent_workers=spec.persistent_workers)
        if kwargs.get("worker_method") != "thread":  # threads start no process
            kwargs["multiprocessing_context"] = method
    return lambda: cls(dataset, **kwargs)


def config_label(spec: WorkloadSpec, method: str | None) -> str:
    parts = [f"{spec.num_workers} workers"]
    if spec.persistent_workers:
        parts.append("persistent")
    if method:
        parts.append(method)
    return ", ".join(parts)


def row_methods(spec: WorkloadSpec, options: BenchOptions) -> list[str | None]:
    """The start method of each of the workload's rows (None: the loader's default)."""
    wanted = (options.quick and spec.quick_start_methods) or spec.start_methods
    if not wanted:
        return [options.start_method]
    available = multiprocessing.get_all_start_methods()
    return [method for method in wanted if method in available]
