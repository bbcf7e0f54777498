"""``conveyor doctor MODULE:OBJECT``: check a dataset, measure it, say what to change.

:func:`load_target` imports a dataset, a function returning one, or a DataLoader.
:func:`examine` runs :func:`conveyor.check`, times samples in-process, sizes one batch,
and loads a few batches at a few worker counts. :func:`advise` (pure) turns the numbers
and findings into advice; :func:`render` prints it all as plain text within 100 columns.
Exit status: 0 when nothing is broken; 1 when the pre-flight found an ERROR or a batch
could not be loaded; 2 when the target cannot be imported or is not a dataset.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing
import operator
import os
import pickle
import statistics
import sys
import textwrap
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from conveyor.dataset import is_iterable_dataset
from conveyor.diagnostics.findings import Finding, Report
from conveyor.diagnostics.preflight import check
from conveyor.errors import PreflightWarning
from conveyor.loader import DataLoader

from ._argtypes import positive_int

__all__ = ["LoaderRun", "Profile", "Target", "UsageError", "advise", "examine", "load_target"]

WIDTH = 100
CHEAP_SAMPLE_S = 50e-6  # below: a worker's cost per batch outweighs the fetching it saves
SLOW_SAMPLE_S = 5e-3  # above: fetching dominates, and more workers help
LARGE_BATCH_BYTES = 50_000_000
SLOW_START_S = 1.0  # workers' first batch slower than this: worth starting them once
SPIKY_RATIO = 10.0  # p95 this many times the median: a few samples are much slower
FETCH_SAMPLES = 50
FETCH_BUDGET_S = 1.0
RUN_BUDGET_S = 2.0  # per worker count, after the first batch
RUN_TIMEOUT_S = 60.0  # a measured loader gives up on a batch after this long
DEFAULT_BATCH_SIZE = 32


class UsageError(Exception):
    """MODULE:OBJECT does not name something doctor can load (exit status 2)."""


# --- what MODULE:OBJECT names -----------------------------------------------------------


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


def _is_loader(obj: Any) -> bool:
    torch_loader = getattr(sys.modules.get("torch.utils.data"), "DataLoader", None)
    return isinstance(obj, DataLoader) or (
        isinstance(torch_loader, type) and isinstance(obj, torch_loader)
    )


def _resolve(obj: Any, spec: str, *, called: bool = False) -> Target:
    """A DataLoader gives its dataset and settings (not its sampler); a dataset is itself;
    anything else callable is called once, with no arguments."""
    if _is_loader(obj):
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


# --- measurements -----------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderRun:
    """One loader at one worker count: time to the first batch, then throughput."""

    num_workers: int
    first_batch_s: float | None = None
    samples_per_s: float | None = None
    batches: int = 0  # timed, after the first
    error: str = ""  # "Type: message" (its first lines) when the loader raised
    refused: str = ""  # the code of the pre-flight finding that kept it from starting
    warnings: tuple[str, ...] = ()
    batch_bytes: tuple[int, int] | None = None  # the first batch's (arrays, other)


@dataclass(frozen=True)
class Profile:
    """What doctor measured; :func:`advise` derives the advice from it."""

    batch_size: int | None
    cpus: int
    start_method: str
    prefetch_factor: int = 2
    fetch_median_s: float | None = None
    fetch_p95_s: float | None = None
    fetch_count: int = 0
    runs: tuple[LoaderRun, ...] = ()
    problems: tuple[str, ...] = ()  # a sample that failed in-process

    @property
    def batch_parts(self) -> tuple[int, int] | None:
        """One batch's bytes as ``(arrays, other)``, from the first run that loaded one."""
        return next((r.batch_bytes for r in self.runs if r.batch_bytes is not None), None)

    @property
    def batch_bytes(self) -> int | None:
        parts = self.batch_parts
        return None if parts is None else sum(parts)

    @property
    def fastest(self) -> LoaderRun | None:
        """The run with the best throughput, if at least two runs were measured."""
        done = [r for r in self.runs if r.samples_per_s]
        return max(done, key=lambda r: r.samples_per_s or 0.0) if len(done) > 1 else None

    @property
    def errors(self) -> int:
        """Distinct failures: one broken sample fails every run the same way."""
        return len({*self.problems, *(r.error for r in self.runs if r.error)})


def time_fetches(
    dataset: Any, count: int = FETCH_SAMPLES, budget_s: float = FETCH_BUDGET_S
) -> tuple[list[float], str]:
    """Seconds per sample for up to ``count`` samples spread over the dataset (the first
    ones of an iterable dataset), and what failed (``dataset[7] raised ...``), if one did."""
    fetches: Iterable[tuple[str, Callable[[], Any]]]
    if is_iterable_dataset(dataset):
        it = iter(dataset)
        fetches = ((f"sample {i} of iter(dataset)", partial(next, it)) for i in range(count))
    else:
        indices = _spread(len(dataset), count)
        fetches = ((f"dataset[{i}]", partial(operator.getitem, dataset, i)) for i in indices)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    for label, fetch in fetches:
        start = time.perf_counter()
        try:
            fetch()
        except StopIteration:
            break
        except Exception as exc:
            return times, f"{label} raised {_exc_text(exc)}"
        times.append(time.perf_counter() - start)
        if start > deadline:
            break
    return times, ""


def _spread(length: int, count: int) -> list[int]:
    if length <= count:
        return list(range(length))
    return sorted({round(k * (length - 1) / (count - 1)) for k in range(count)})


def batch_nbytes(batch: Any) -> tuple[int, int]:
    """``(arrays, other)``: the nbytes of the arrays and tensors in ``batch``, and the
    pickled size of everything else (keys included)."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    arrays = other = 0
    stack = [batch]
    while stack:
        obj = stack.pop()
        is_array = hasattr(obj, "__array_interface__") or (
            isinstance(tensor, type) and isinstance(obj, tensor)
        )
        if is_array and isinstance(getattr(obj, "nbytes", None), int):
            arrays += obj.nbytes
        elif isinstance(obj, Mapping):
            stack.extend(obj.values())
            other += sum(_pickled_size(key) for key in obj)
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        else:
            other += _pickled_size(obj)
    return arrays, other


def _pickled_size(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj, protocol=5))
    except Exception:  # it will not reach the main process anyway: the loader says why
        return 0


def run_loader(
    target: Target,
    num_workers: int,
    *,
    batch_size: int | None,
    start_method: str,
    max_batches: int,
    budget_s: float = RUN_BUDGET_S,
) -> LoaderRun:
    """Time a fresh loader's first batch, then up to ``max_batches`` more (at most about
    ``budget_s``). Errors and warnings are recorded, not raised; pre-flight warnings are
    left out (the report has them)."""
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "collate_fn": target.collate_fn,
        "num_workers": num_workers,
    }
    if num_workers:
        kwargs.update(
            worker_init_fn=target.worker_init_fn,
            multiprocessing_context=start_method,
            prefetch_factor=target.prefetch_factor,
            timeout=RUN_TIMEOUT_S,
        )
    first = rate = size = None
    timed = 0
    error = refused = ""
    it: Iterator[Any] | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", PreflightWarning)
        try:
            start = time.perf_counter()
            it = iter(DataLoader(target.dataset, **kwargs))
            size = batch_nbytes(next(it))
            first = time.perf_counter() - start
            samples, start = 0, time.perf_counter()
            for batch in it:
                samples += _batch_len(batch, batch_size)
                timed += 1
                if timed >= max_batches or time.perf_counter() - start > budget_s:
                    break
            if timed:
                rate = samples / (time.perf_counter() - start)
        except StopIteration:
            error = "the loader gave no batch"
        except Exception as exc:
            finding = getattr(exc, "finding", None)
            if isinstance(finding, Finding):  # the pre-flight kept the workers from starting
                refused = finding.code
            else:
                error = _exc_text(exc, lines=4)
        finally:
            with contextlib.suppress(Exception):
                getattr(it, "close", lambda: None)()
    seen = tuple(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    return LoaderRun(num_workers, first, rate, timed, error, refused, seen, size)


def _batch_len(batch: Any, batch_size: int | None) -> int:
    """Samples in a batch: the leading size of its first array, else ``batch_size``."""
    node = batch
    for _ in range(8):
        shape = getattr(node, "shape", None)
        if shape is not None and hasattr(shape, "__len__"):
            return int(shape[0]) if len(shape) else 1
        if isinstance(node, Mapping) and node:
            node = next(iter(node.values()))
        elif isinstance(node, (list, tuple)) and node:
            node = node[0]
        else:
            break
    return batch_size or 1


def _exc_text(exc: BaseException, lines: int = 1) -> str:
    """``Type: message``, the message cut to its first ``lines`` lines."""
    text = "\n".join(str(exc).strip().splitlines()[:lines])
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def examine(
    target: Target,
    *,
    workers: Sequence[int] | None = None,
    batch_size: int | None = None,
    start_method: str | None = None,
    batches: int = 20,
) -> tuple[Report, Profile]:
    """Run the pre-flight and every measurement for ``target``."""
    counts = tuple(workers) if workers else tuple(sorted({0, 2, target.num_workers}))
    method = start_method or target.start_method or _default_start_method()
    size = batch_size or target.batch_size
    most = max(counts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # more workers than CPUs: measured below
        loader = DataLoader(
            target.dataset,
            batch_size=size,
            collate_fn=target.collate_fn,
            num_workers=most,
            worker_init_fn=target.worker_init_fn,
            multiprocessing_context=method if most else None,
            prefetch_factor=target.prefetch_factor if most else None,
        )
    report = check(loader, num_workers=most, multiprocessing_context=method)

    times, fetch_error = time_fetches(target.dataset)
    runs = tuple(
        run_loader(target, n, batch_size=size, start_method=method, max_batches=batches)
        for n in counts
    )
    profile = Profile(
        batch_size=size,
        cpus=usable_cpus(),
        start_method=method,
        prefetch_factor=target.prefetch_factor,
        fetch_median_s=statistics.median(times) if times else None,
        fetch_p95_s=sorted(times)[round(0.95 * (len(times) - 1))] if times else None,
        fetch_count=len(times),
        runs=runs,
        problems=(fetch_error,) if fetch_error else (),
    )
    return report, profile


def _default_start_method() -> str:
    """The platform's default (the first listed), without making it multiprocessing's."""
    chosen = multiprocessing.get_start_method(allow_none=True)
    return chosen or multiprocessing.get_all_start_methods()[0]


# --- advice ------------------------------------------------------------------------------


def advise(profile: Profile, findings: Sequence[Finding] = ()) -> list[str]:
    """What to change, from the pre-flight findings and the numbers in ``profile``.

    Each item says what was seen, then what to do: the findings' fixes (worst first),
    a failure to load, then advice from fetch time, batch size and start-up time.
    """
    advice = [f"[{f.code}] {_place(f)}: {f.fix}" for f in findings if f.fix]
    failed = [p.split(" raised ")[0] for p in profile.problems]
    failed += [f"num_workers={r.num_workers}" for r in profile.runs if r.error]
    if failed:
        advice.append(
            f"Loading failed ({', '.join(failed)}; the error is above). Fix it first: a "
            "training loop fails the same way, and the numbers above are incomplete."
        )
    median, p95 = profile.fetch_median_s, profile.fetch_p95_s
    if median is not None and median < CHEAP_SAMPLE_S:
        advice.append(
            f"Samples are cheap (median {fmt_seconds(median)}): worker processes cost more "
            "than they save here. Keep num_workers low, or 0."
        )
    elif median is not None and median > SLOW_SAMPLE_S:
        advice.append(
            f"Samples are slow (median {fmt_seconds(median)}, about {1 / median:,.0f} "
            f"samples/s per process): use more workers, up to the {profile.cpus} CPUs this "
            f"process may use (num_workers={profile.cpus})."
        )
    if median and p95 is not None and p95 > SPIKY_RATIO * median and p95 > 1e-3:
        advice.append(
            f"A few samples are much slower than most (p95 {fmt_seconds(p95)}, median "
            f"{fmt_seconds(median)}). A batch waits for its slowest sample; a higher "
            "prefetch_factor evens this out."
        )
    size = profile.batch_bytes
    if size is not None and size > LARGE_BATCH_BYTES:
        workers = max((r.num_workers for r in profile.runs), default=0) or 1
        held = workers * profile.prefetch_factor
        advice.append(
            f"Batches are large ({fmt_bytes(size)}): with num_workers={workers} and "
            f"prefetch_factor={profile.prefetch_factor}, {held} batches ({fmt_bytes(held * size)}) "
            "can be in flight. Lower batch_size or prefetch_factor."
        )
    slow = [r for r in profile.runs if r.num_workers and (r.first_batch_s or 0.0) > SLOW_START_S]
    if slow:
        advice.append(
            f"Workers take {fmt_seconds(slow[-1].first_batch_s or 0.0)} to deliver the first "
            f"batch (num_workers={slow[-1].num_workers}, start method {profile.start_method}): "
            "pass persistent_workers=True so they start once, not every epoch."
        )
    fastest = profile.fastest
    if fastest is not None:
        advice.append(
            f"Fastest measured: num_workers={fastest.num_workers} "
            f"({fastest.samples_per_s or 0.0:,.0f} samples/s)."
        )
    return advice


def _place(finding: Finding) -> str:
    return finding.where or "environment"


# --- the report --------------------------------------------------------------------------


def fmt_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1.0 else f"{seconds:.2f} s"


def fmt_bytes(count: float) -> str:
    if count < 1000:
        return f"{count:.0f} B"
    for unit in ("kB", "MB", "GB"):
        count /= 1000
        if count < 1000 or unit == "GB":
            break
    return f"{count:.1f} {unit}"


def _wrap(text: str, first: str, indent: str) -> list[str]:
    """``text`` wrapped at :data:`WIDTH`, each of its lines on its own."""
    lines: list[str] = []
    for i, paragraph in enumerate(text.splitlines() or [""]):
        start = first if i == 0 else indent
        wrapped = textwrap.wrap(paragraph, WIDTH, initial_indent=start, subsequent_indent=indent)
        lines += wrapped or [start.rstrip()]
    return lines


def _facts(pairs: Sequence[tuple[str, str]], width: int) -> list[str]:
    """``key   value`` lines, the values aligned and wrapped."""
    pad = " " * (width + 4)
    return [line for key, value in pairs for line in _wrap(value, f"  {key:<{width}}  ", pad)]


def render(target: Target, profile: Profile, report: Report, advice: Sequence[str]) -> str:
    """The plain-text report: no colours, at most :data:`WIDTH` columns."""
    dataset, kind = target.dataset, type(target.dataset)
    size = ""
    with contextlib.suppress(Exception):
        size = f", {len(dataset):,} samples"
    style = "iterable-style" if is_iterable_dataset(dataset) else "map-style"
    collate = getattr(target.collate_fn, "__qualname__", None) or "default_collate"
    out = [f"conveyor doctor {target.spec}", ""]
    out += _facts(
        [
            ("dataset", f"{kind.__module__}.{kind.__qualname__} ({style}{size})"),
            ("loader", f"batch_size={profile.batch_size}, collate_fn={collate}"),
            ("workers", f"start method {profile.start_method}, {profile.cpus} CPUs usable"),
        ],
        width=8,
    )
    out += ["", "Pre-flight checks", *(f"  {line}".rstrip() for line in str(report).splitlines())]

    fetch = batch = "not measured"
    if profile.fetch_median_s is not None and profile.fetch_p95_s is not None:
        fetch = (
            f"median {fmt_seconds(profile.fetch_median_s)}, p95 "
            f"{fmt_seconds(profile.fetch_p95_s)} ({profile.fetch_count} samples, in-process)"
        )
    if profile.batch_parts is not None:
        arrays, other = profile.batch_parts
        batch = f"{fmt_bytes(arrays + other)} (arrays {fmt_bytes(arrays)}, other data pickled "
        batch += f"{fmt_bytes(other)})"
    elif any(r.error for r in profile.runs):
        batch = "not measured: no batch loaded"
    out += ["", "Measurements"]
    out += _facts([("per-sample fetch", fetch), ("one batch", batch)], width=16)
    out += [line for problem in profile.problems for line in _wrap(problem, "  !  ", "     ")]

    out += ["", f"  {'workers':>7}  {'first batch':>11}  {'samples/s':>11}  {'batches':>7}"]
    shown: dict[str, int] = {}  # error -> the first worker count that had it
    for run in profile.runs:
        first = fmt_seconds(run.first_batch_s) if run.first_batch_s is not None else "-"
        rate = f"{run.samples_per_s:,.0f}" if run.samples_per_s else "-"
        mark = "  fastest" if run is profile.fastest else ""
        out.append(f"  {run.num_workers:>7}  {first:>11}  {rate:>11}  {run.batches:>7}{mark}")
        notes = []
        if run.error in shown:
            notes.append(f"failed: the same error as num_workers={shown[run.error]}")
        elif run.error:
            notes.append(f"failed: {run.error}")
            shown[run.error] = run.num_workers
        notes += [f"not started: the pre-flight found [{run.refused}]"] if run.refused else []
        notes += [f"warning: {w.splitlines()[0]}" for w in run.warnings]
        out += [line for note in notes for line in _wrap(note, " " * 11, " " * 13)]

    out += ["", "What to change"]
    out += [line for item in advice for line in _wrap(item, "  - ", "    ")] or ["  nothing"]
    errors, warned = len(report.errors) + profile.errors, len(report.warnings)
    status = 1 if errors else 0
    out += ["", f"{_count(errors, 'error')}, {_count(warned, 'warning')}: exit status {status}"]
    return "\n".join(out)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# --- the command -------------------------------------------------------------------------


def _worker_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts >= 0, e.g. 0,1,2,4")
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``doctor`` subcommand's options."""
    parser.add_argument(
        "target",
        metavar="MODULE:OBJECT",
        help="a dataset, a function returning one, or a DataLoader; MODULE is dotted "
        "(importable from the current directory) or a path to a .py file",
    )
    parser.add_argument(
        "--workers",
        type=_worker_counts,
        default=None,
        metavar="N[,N...]",
        help="worker counts to measure (default: 0, 2 and a DataLoader's own num_workers)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"default: a DataLoader's own, else {DEFAULT_BATCH_SIZE}",
    )
    parser.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default=None,
        help="default: a DataLoader's own, else the platform's",
    )
    parser.add_argument(
        "--batches",
        type=positive_int,
        default=20,
        metavar="K",
        help=f"batches timed per worker count after the first (default: 20, at most about "
        f"{RUN_BUDGET_S:.0f} s)",
    )


def run(args: argparse.Namespace) -> int:
    """Examine ``args.target``, print the report, and return the exit status."""
    try:
        target = load_target(args.target)
    except UsageError as exc:
        print(f"conveyor doctor: {exc}", file=sys.stderr)
        return 2
    report, profile = examine(
        target,
        workers=args.workers,
        batch_size=args.batch_size,
        start_method=args.start_method,
        batches=args.batches,
    )
    print(render(target, profile, report, advise(profile, report.findings)), flush=True)
    return 1 if report.errors or profile.errors else 0
