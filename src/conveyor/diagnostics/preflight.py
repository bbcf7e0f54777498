"""Pre-flight checks: say what would break in the workers before any of them starts.

* :func:`run_automatic` runs on a loader's first iteration with workers, given
  the loader's :class:`~conveyor.config.LoaderConfig` (never the loader). It
  is cheap — one bounded walk of the dataset, ``collate_fn`` and
  ``worker_init_fn``, a few system calls; nothing pickled unless a handle
  turned up, no sample fetched — and quiet on ordinary datasets. The first
  ERROR is raised (``UnpicklableError``, or ``ConfigError`` naming the fix)
  before any worker process exists; each WARNING is emitted once as a
  :class:`~conveyor.errors.PreflightWarning`.
* :func:`warn_at_construction` says, when a loader with thread workers is built, what
  draws from torch's global generator, which its threads would share (a kind of worker
  says what it cannot keep at construction, not mid-run); :func:`run_automatic` then
  leaves that finding out.
* :func:`check` returns the full :class:`Report`: it also pickles what spawn
  and forkserver workers receive (naming the attribute that fails), fetches
  one batch to estimate the memory the prefetch needs, and adds INFO findings.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

import cloudpickle

from .._torch.datapipes import is_datapipe
from .._workers import kinds
from .._workers.kinds import WorkerKind
from .._workers.start_method import StartMethod
from ..config import LoaderConfig
from ..errors import ConfigError, PreflightWarning, add_note
from . import environment
from .findings import Finding, Report, Severity
from .fork_hazards import container_findings, cuda_findings, rng_findings, thread_findings
from .handle_hazards import descriptor_findings, handle_findings
from .pickling import explain_unpicklable, find_unpicklable
from .thread_hazards import thread_hazard_findings, torch_draw_findings
from .walk import Walk

__all__ = [
    "Finding",
    "Report",
    "Severity",
    "automatic_findings",
    "check",
    "run_automatic",
    "warn_at_construction",
]

_MAX_BATCH_LEAVES = 10_000
_FULL_WALK_OBJECTS = 20_000  # check() may look further than the automatic pre-flight
_SAID_AT_CONSTRUCTION = frozenset({"thread-torch-rng"})
_SKIP_NOTE = (
    "conveyor found this before starting any worker; DataLoader(..., preflight=False) "
    "skips these checks."
)


@dataclass(frozen=True)
class _Target:
    """What a check looks at, whether it was given a DataLoader or a bare dataset."""

    roots: tuple[tuple[str, Any], ...]  # ("dataset", ...), ("collate_fn", ...), ...
    start_method: StartMethod
    num_workers: int
    prefetch_factor: int
    batch_size: int | None  # None: samples are not batched (or a batch_sampler decides)
    auto_collation: bool
    collate_fn: Callable[[Any], Any] | None
    iterable: bool
    kind: WorkerKind = kinds.MULTIPROCESSING
    threads_per_worker: int = 1  # worker processes of several cores in threads

    @property
    def processes(self) -> int:
        """Worker processes (``num_workers`` counts cores: several a process in threads)."""
        return self.num_workers // self.threads_per_worker

    @property
    def threads(self) -> bool:
        """The workers are threads of this process: nothing pickled, nothing forked."""
        return self.kind.in_this_process

    @property
    def dataset(self) -> Any:
        return self.roots[0][1]

    def subject(self) -> str:
        workers = f"{self.processes} worker" + ("" if self.processes == 1 else "s")
        if self.threads_per_worker > 1:
            workers += f" of {self.threads_per_worker} threads"
        kind = type(self.dataset)
        name = f"{kind.__module__}.{kind.__qualname__}"
        if self.threads:
            return f"{name} ({self.num_workers} thread {workers.split(' ', 1)[1]})"
        return f"{name} ({workers}, start method {self.start_method.name!r})"


def check(
    dataset_or_loader: Any,
    *,
    num_workers: int | None = None,
    multiprocessing_context: str | BaseContext | None = None,
    worker_method: str | None = None,
) -> Report:
    """Check a dataset (or a ``DataLoader``, or its ``LoaderConfig``) for what would
    break in worker processes (or thread workers: ``worker_method="thread"``).

    Returns a :class:`Report`; ``print(report)`` for people, ``report.errors`` and
    ``report.warnings`` for programs. A loader is checked with its own settings, which
    ``num_workers``, ``multiprocessing_context`` and ``worker_method`` override. A bare
    dataset is checked as ``DataLoader(dataset, num_workers=...)`` would load it (batch
    size 1, the default start method), with as many workers as usable CPUs unless
    ``num_workers`` says otherwise. With ``num_workers=0`` there is nothing to
    find: nothing crosses a process boundary.

    It pickles the dataset once under spawn/forkserver and fetches one batch to
    estimate memory, so it costs more than the automatic pre-flight.
    """
    target = _target(dataset_or_loader, num_workers, multiprocessing_context)
    if worker_method is not None:
        kind = kinds.find(worker_method)
        if kind is None:
            raise ConfigError(
                f"worker_method should be one of {kinds.names()}, got {worker_method!r}"
            )
        target = dataclasses.replace(target, kind=kind)
    if target.kind.always_pickled:  # the objects reach its workers pickled, as spawn's do
        target = dataclasses.replace(target, start_method=StartMethod("spawn"))
    findings: list[Finding] = []
    if target.num_workers > 0:
        pickled = target.start_method.pickles_objects and not target.threads
        walk = Walk(target.roots, pickled=pickled, max_objects=_FULL_WALK_OBJECTS)
        findings += _object_findings(walk, target, full=True)
        if not target.threads:  # threads take no process, no descriptors, and may outnumber cores
            findings += environment.cpu_findings(target.processes)
            findings += environment.fd_findings(target.num_workers)
        batch_bytes = _batch_bytes(target)
        if batch_bytes:
            findings += environment.memory_findings(
                target.num_workers, target.prefetch_factor, batch_bytes
            )
    return Report(_worst_first(findings), subject=target.subject())


def automatic_findings(config: LoaderConfig) -> list[Finding]:
    """The cheap checks :func:`run_automatic` acts on, worst first."""
    return _automatic(_from_config(config, None, None))


def _automatic(target: _Target) -> list[Finding]:
    if target.threads:
        walk = Walk(target.roots, pickled=False)
        return thread_hazard_findings(walk, dict(target.roots).get("worker_init_fn"))
    walk = Walk(target.roots, pickled=target.start_method.pickles_objects)
    findings = _object_findings(walk, target, full=False)
    findings += environment.cpu_findings(target.processes, automatic=True)
    findings += environment.fd_findings(target.num_workers)  # each core holds its own
    return list(_worst_first(findings))


def run_automatic(config: LoaderConfig, stacklevel: int = 3) -> None:
    """Raise the first ERROR the cheap checks find, else warn once per WARNING."""
    target = _from_config(config, None, None)
    findings = _automatic(target)
    for finding in findings:
        if finding.severity is Severity.ERROR:
            error = _as_error(finding, target)
            if error is not None:
                raise error
    for finding in findings:
        if finding.severity is Severity.WARNING and finding.code not in _SAID_AT_CONSTRUCTION:
            # The caller says how deep the user's ``for batch in loader`` is.
            _warn(finding, stacklevel)


def warn_at_construction(config: LoaderConfig, stacklevel: int = 3) -> None:
    """Warn, as the loader is built, of what draws from torch's global generator when its
    workers are threads (or processes of several threads); ``stacklevel``: how deep the
    user's ``DataLoader(...)`` line is."""
    threads = config.kind.in_this_process or config.options.threads_per_worker > 1
    if not (config.options.preflight and config.num_workers > 0 and threads):
        return
    walk = Walk(_from_config(config, None, None).roots, pickled=False)
    for finding in torch_draw_findings(walk):
        _warn(finding, stacklevel)


def _warn(finding: Finding, stacklevel: int) -> None:
    warning = PreflightWarning(finding.message())
    warning.finding = finding
    warnings.warn(warning, stacklevel=stacklevel + 1)


# --- what to check ------------------------------------------------------------------


def _target(obj: Any, num_workers: int | None, context: str | BaseContext | None) -> _Target:
    from ..collate import default_collate
    from ..dataset import is_iterable_dataset

    config = obj if isinstance(obj, LoaderConfig) else _config_of(obj)
    if config is not None:  # a DataLoader (never imported here) or its config
        return _from_config(config, num_workers, context)
    return _Target(
        roots=(("dataset", obj),),
        start_method=StartMethod.of(context),
        num_workers=environment.cpus().usable if num_workers is None else num_workers,
        prefetch_factor=2,
        batch_size=1,
        auto_collation=True,
        collate_fn=default_collate,
        iterable=is_iterable_dataset(obj),
    )


def _config_of(obj: Any) -> LoaderConfig | None:
    """A DataLoader's config (a dataset's ``__getattr__`` may raise anything)."""
    try:
        config = getattr(obj, "_config", None)
    except Exception:
        return None
    return config if isinstance(config, LoaderConfig) else None


def _from_config(
    config: LoaderConfig, num_workers: int | None, context: str | BaseContext | None
) -> _Target:
    """What to check for a loader: its settings, where ``check()``'s arguments do not
    override them (``num_workers=None`` keeps the loader's, or all usable CPUs for 0)."""
    # The loader's num_workers counts cores; the argument, as DataLoader's, processes.
    workers = (
        config.num_workers
        if num_workers is None
        else num_workers * config.options.threads_per_worker
    )
    return _Target(
        roots=(
            ("dataset", config.dataset),
            ("collate_fn", config.collate_fn),
            ("worker_init_fn", config.worker_init_fn),
        ),
        start_method=config.start_method if context is None else StartMethod.of(context),
        num_workers=workers or (environment.cpus().usable if num_workers is None else 0),
        prefetch_factor=config.prefetch_factor or 2,
        batch_size=config.batch_size,
        auto_collation=config.auto_collation,
        collate_fn=config.collate_fn,
        iterable=config.iterable,
        kind=config.kind,
        threads_per_worker=config.options.threads_per_worker,
    )


def _object_findings(walk: Walk, target: _Target, *, full: bool) -> list[Finding]:
    if target.threads:
        return thread_hazard_findings(walk, dict(target.roots).get("worker_init_fn"))
    method = target.start_method
    findings = handle_findings(walk, method)
    if full and method.pickles_objects:  # the definitive answer: pickle each root
        findings = [f for f in findings if f.code != "unpicklable"]
        findings += _unpicklable_findings(target)
    findings += container_findings(walk, method)
    roots = dict(target.roots)
    if not is_datapipe(roots["dataset"]):  # the loader seeds a DataPipe's generators itself
        findings += rng_findings(walk, method, roots.get("worker_init_fn"))
    findings += descriptor_findings(walk, method)
    if target.threads_per_worker > 1:  # each process's cores share its objects
        findings += thread_hazard_findings(walk, roots.get("worker_init_fn"))
    if method.copies_memory:
        findings += cuda_findings(walk, full=full)
        findings += thread_findings()
    return findings


def _unpicklable_findings(target: _Target) -> list[Finding]:
    findings = []
    for role, obj in target.roots:
        if obj is None:
            continue
        for found in find_unpicklable(obj, role):
            findings.append(
                Finding(
                    code="unpicklable",
                    severity=Severity.ERROR,
                    where=found.path,
                    what=f"The {role} cannot be sent to the {target.start_method.name} workers",
                    why=found.why(),
                    fix=found.fix() + ".",
                )
            )
    return findings


def _worst_first(findings: Sequence[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: -f.severity))


# --- acting on findings -------------------------------------------------------------


def _as_error(finding: Finding, target: _Target) -> Exception | None:
    """The exception for an ERROR finding (None if, looked at closely, it is not one).

    An object that cannot be pickled gets the same error the worker pool would
    raise a moment later (so ``preflight=False`` would not help, and is not
    offered); the rest are the pre-flight's own, with the way to skip it.
    """
    if finding.code == "unpicklable":
        role = finding.where.split(".", 1)[0].split("[", 1)[0]
        obj = dict(target.roots).get(role)
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:
            error: Exception = explain_unpicklable(
                obj, role, exc, role=role, start_method=target.start_method
            )
            error.__cause__ = exc
        else:
            return None  # the object's own pickling leaves the handle out
    else:
        error = ConfigError(finding.message())
        add_note(error, _SKIP_NOTE)
    error.finding = finding  # type: ignore[attr-defined]
    return error


# --- one batch, to estimate memory ----------------------------------------------------


def _batch_bytes(target: _Target) -> int | None:
    """Bytes of a batch of the first samples, or None if that cannot be had cheaply.

    Iterable datasets are not started, and samplers are not drawn from (that
    would move the user's random stream): the indices are 0, 1, ...
    """
    if target.iterable or target.collate_fn is None:
        return None
    if target.auto_collation and target.batch_size is None:
        return None  # a batch_sampler: its batches' size is unknown
    dataset = target.dataset
    try:
        if target.auto_collation:
            size = min(len(dataset), target.batch_size or 1)
            batch = target.collate_fn([dataset[i] for i in range(size)])
        else:
            batch = target.collate_fn(dataset[0])
    except Exception:  # the loader reports this better, with the index
        return None
    return _nbytes(batch)


def _nbytes(batch: Any) -> int:
    """Bytes in a batch's arrays, tensors, strings and other leaves (bounded)."""
    total, stack, seen = 0, [batch], 0
    while stack and seen < _MAX_BATCH_LEAVES:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(getattr(item, "nbytes", None), int):  # arrays, tensors
            total += item.nbytes
        else:
            total += sys.getsizeof(item)
    return total
