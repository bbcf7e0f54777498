"""Pre-flight checks: say what would break in the workers before any of them starts.

* :func:`run_automatic` runs on a loader's first iteration with workers, given
  the loader's :class:`~conveyor.config.LoaderConfig` (never the loader). It
  is cheap — one bounded walk of the dataset, ``collate_fn`` and
  ``worker_init_fn``, a few system calls; nothing pickled unless a handle
  turned up, no sample fetched — and quiet on ordinary datasets. The first
  ERROR is raised (``UnpicklableError``, or ``ConfigError`` naming the fix)
  before any worker process exists; each WARNING is emitted once as a
  :class:`~conveyor.errors.PreflightWarning`.
* :func:`warn_at_construction` says, when a loader is built, what it cannot keep: with
  thread workers, what draws from torch's global generator, which its threads would
  share; with persistent workers, a method of ``epoch_calls`` whose calls it cannot see
  (a kind of worker says what it cannot keep at construction, not mid-run);
  :func:`run_automatic` then leaves those findings out.
* :func:`check` returns the full :class:`Report`: it also pickles what spawn
  and forkserver workers receive (naming the attribute that fails), fetches
  one batch to estimate the memory the prefetch needs, and adds INFO findings.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from typing import Any

import cloudpickle

from .._torch.datapipes import is_datapipe
from .._workers import kinds
from .._workers.start_method import StartMethod
from ..config import LoaderConfig
from ..errors import ConfigError, PreflightWarning, add_note
from . import environment
from .epoch_hazards import UNWATCHED, epoch_call_findings
from .findings import Finding, Report, Severity
from .fork_hazards import container_findings, cuda_findings, rng_findings, thread_findings
from .handle_hazards import descriptor_findings, handle_findings
from .pickling import explain_unpicklable, find_unpicklable
from .target import Target, from_config, target_of
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
_SAID_AT_CONSTRUCTION = frozenset({"thread-torch-rng", UNWATCHED})
_SKIP_NOTE = (
    "conveyor found this before starting any worker; DataLoader(..., preflight=False) "
    "skips these checks."
)


def check(
    dataset_or_loader: Any,
    *,
    num_workers: int | None = None,
    multiprocessing_context: str | BaseContext | None = None,
    worker_method: str | None = None,
) -> Report:
    """Check a dataset (or a ``DataLoader``, conveyor's or torch's, or its
    ``LoaderConfig``) for what would break in worker processes (or thread workers:
    ``worker_method="thread"``).

    Returns a :class:`Report`; ``print(report)`` for people, ``report.errors`` and
    ``report.warnings`` for programs. A loader is checked with its own settings, which
    ``num_workers``, ``multiprocessing_context`` and ``worker_method`` override; torch's
    with what it does not do (tell persistent workers of ``dataset.set_epoch``). A bare
    dataset is checked as ``DataLoader(dataset, num_workers=...)`` would load it (batch
    size 1, the default start method), with as many workers as usable CPUs unless
    ``num_workers`` says otherwise. With ``num_workers=0`` there is nothing to
    find: nothing crosses a process boundary.

    It pickles the dataset once under spawn/forkserver and fetches one batch to
    estimate memory, so it costs more than the automatic pre-flight.
    """
    target = target_of(dataset_or_loader, num_workers, multiprocessing_context)
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
        findings += _epoch_findings(target)
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
    return _automatic(from_config(config, None, None))


def _automatic(target: Target) -> list[Finding]:
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
    target = from_config(config, None, None)
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
    """Warn, as the loader is built, of what it cannot keep: what draws from torch's
    global generator when its workers are threads (or processes of several threads), and
    a method of ``epoch_calls`` whose calls it cannot see (persistent workers);
    ``stacklevel``: how deep the user's ``DataLoader(...)`` line is."""
    if not (config.options.preflight and config.num_workers > 0):
        return
    target = from_config(config, None, None)
    found = [f for f in _epoch_findings(target) if f.code == UNWATCHED]
    if config.kind.in_this_process or config.options.threads_per_worker > 1:
        found += torch_draw_findings(Walk(target.roots, pickled=False))
    for finding in found:
        _warn(finding, stacklevel)


def _epoch_findings(target: Target) -> list[Finding]:
    return epoch_call_findings(
        target.dataset,
        num_workers=target.num_workers,
        persistent=target.persistent_workers,
        epoch_calls=target.epoch_calls,
    )


def _warn(finding: Finding, stacklevel: int) -> None:
    warning = PreflightWarning(finding.message())
    warning.finding = finding
    warnings.warn(warning, stacklevel=stacklevel + 1)


def _object_findings(walk: Walk, target: Target, *, full: bool) -> list[Finding]:
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


def _unpicklable_findings(target: Target) -> list[Finding]:
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


def _as_error(finding: Finding, target: Target) -> Exception | None:
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


def _batch_bytes(target: Target) -> int | None:
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
