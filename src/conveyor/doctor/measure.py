"""Measuring a target: the pre-flight, fetch times, one batch's bytes, runs per worker count."""

from __future__ import annotations

import contextlib
import operator
import pickle
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from conveyor import DataLoader
from conveyor._workers.start_method import StartMethod
from conveyor.dataset import is_iterable_dataset
from conveyor.diagnostics.environment import affinity
from conveyor.diagnostics.epoch_hazards import epoch_call_findings
from conveyor.diagnostics.findings import Finding, Report
from conveyor.diagnostics.preflight import check
from conveyor.doctor.profile import LoaderRun, Profile, ThreadProbe
from conveyor.doctor.target import Target
from conveyor.errors import PreflightWarning

__all__ = [
    "batch_nbytes",
    "examine",
    "probe_threads",
    "run_loader",
    "time_fetches",
    "usable_cpus",
]

FETCH_SAMPLES = 50
FETCH_BUDGET_S = 1.0
PROBE_THREADS = 8
PROBE_BUDGET_S = 0.5  # per pass (one thread, then PROBE_THREADS)
RUN_BUDGET_S = 2.0  # per worker count, after the first batch
RUN_TIMEOUT_S = 60.0  # a measured loader gives up on a batch after this long


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
    method = start_method or target.start_method or StartMethod.of(None).name
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
    # The loader measured is a fresh one of conveyor's; what the user's own does between
    # epochs (torch's tells persistent workers nothing of set_epoch) is the target's.
    epochs = epoch_call_findings(
        target.dataset,
        num_workers=target.num_workers,
        persistent=target.persistent_workers,
        epoch_calls=target.epoch_calls,
    )
    if epochs:
        report = Report((*report.findings, *epochs), subject=report.subject)
    hazards = check(loader, num_workers=max(most, 1), worker_method="thread")

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
        threads=None if fetch_error else probe_threads(target.dataset),
        thread_hazards=tuple(f"{f.where} ({f.code})" for f in hazards.findings),
    )
    return report, profile


def usable_cpus() -> int:
    return affinity()


# --- one sample at a time, in-process ---------------------------------------------------


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


def probe_threads(
    dataset: Any, threads: int = PROBE_THREADS, budget_s: float = PROBE_BUDGET_S
) -> ThreadProbe | None:
    """Fetch samples in one thread, then in ``threads`` threads at once, for about
    ``budget_s`` each (map-style datasets; None for iterable ones, or if one raised)."""
    if is_iterable_dataset(dataset):
        return None
    try:
        length = len(dataset)
    except TypeError:
        return None
    if not length:
        return None
    try:
        one, cpu_share = _fetch_for(dataset, length, 1, budget_s)
        many, _ = _fetch_for(dataset, length, threads, budget_s)
    except Exception:  # time_fetches reports a failing sample better
        return None
    return ThreadProbe(threads, one, many, cpu_share)


def _fetch_for(dataset: Any, length: int, threads: int, budget_s: float) -> tuple[float, float]:
    """Samples/s with ``threads`` threads fetching for ``budget_s``, and the process's CPU
    time over the wall time meanwhile."""
    deadline = time.perf_counter() + budget_s
    counts = [0] * threads
    errors: list[BaseException] = []

    def fetch(slot: int) -> None:
        i = slot
        try:
            while time.perf_counter() < deadline:
                dataset[i % length]
                counts[slot] += 1
                i += threads
        except BaseException as exc:
            errors.append(exc)

    cpu, start = time.process_time(), time.perf_counter()
    if threads == 1:
        fetch(0)
    else:
        workers = [threading.Thread(target=fetch, args=(k,), daemon=True) for k in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / wall, (time.process_time() - cpu) / wall


def _spread(length: int, count: int) -> list[int]:
    if length <= count:
        return list(range(length))
    return sorted({round(k * (length - 1) / (count - 1)) for k in range(count)})


# --- a loader at one worker count -------------------------------------------------------


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
    """Samples in a batch: the leading size of its first array, else ``batch_size``. A
    batch of zero rows (a collate_fn that filtered every sample out) still cost its
    samples' fetches: it counts as ``batch_size``."""
    node = batch
    for _ in range(8):
        shape = getattr(node, "shape", None)
        if shape is not None and hasattr(shape, "__len__"):
            rows = int(shape[0]) if len(shape) else 1
            return rows or batch_size or 1
        if isinstance(node, Mapping) and node:
            node = next(iter(node.values()))
        elif isinstance(node, (list, tuple)) and node:
            node = node[0]
        else:
            break
    return batch_size or 1


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


def _exc_text(exc: BaseException, lines: int = 1) -> str:
    """``Type: message``, the message cut to its first ``lines`` lines."""
    text = "\n".join(str(exc).strip().splitlines()[:lines])
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
