"""The ``ray`` workload: what going through Ray costs, against process workers on the
same machine.

Rows (conveyor only, both ways on this machine, the same number of workers):

* the ``decode`` workload's pipeline (JPEG bytes decoded, randomly resized-cropped to
  224x224 and flipped, with Pillow) with process workers, then with Ray workers; the Ray
  row's note is the cost of Ray per batch: wall time (µs and a ratio) and CPU, the
  driver's and the whole machine's (Ray's own processes included);
* image batches (64 x 3x224x224 uint8, 9.6 MB) with process workers, then Ray workers:
  bytes/s through shared memory, then through Ray's object store.

Ray is optional: without it the workload's one row says "skipped: ray not installed".
Ray workers run on the cluster this process is connected to, on ``RAY_ADDRESS``'s, or on
a local cluster started for the workload (and stopped after it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from conveyor_bench.measure import LoaderFactory, Measurement, _time_window
from conveyor_bench.rows import Row
from conveyor_bench.specs import WindowSpec, WorkloadSpec
from conveyor_bench.workloads import ImageDataset

if TYPE_CHECKING:
    from conveyor_bench.options import BenchOptions

LOADER = "conveyor"  # the column the rows' figures go in
IMAGE_BATCH = 64  # 64 x 3x224x224 uint8: 9.6 MB
ACTOR_TITLE = "ray::ConveyorWorker"
_EXIT_GRACE_S = 10.0


def skipped(no_conveyor: bool) -> str | None:
    """Why the workload cannot run here, or None."""
    if importlib.util.find_spec("ray") is None:
        return "ray not installed"
    if no_conveyor:
        return "it measures conveyor's own Ray workers"
    return None


@contextlib.contextmanager
def ray_cluster(cpus: int) -> Iterator[str]:
    """Ray connected: as it is, to ``RAY_ADDRESS``'s cluster, or to a local cluster of
    ``cpus`` CPUs started here and stopped on the way out. Yields where it runs."""
    import ray

    if ray.is_initialized():
        yield "the Ray cluster this process is connected to"
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
        where = f"the Ray cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']}"
    else:
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        where = f"a local Ray cluster of {cpus} CPUs"
    try:
        yield where
    finally:
        ray.shutdown()


def _actors() -> set[int]:
    found = set()
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(ACTOR_TITLE):
                found.add(proc.pid)
    return found


def measure_remote(make_loader: LoaderFactory, window: WindowSpec) -> Measurement:
    """A timed window, as measure_throughput times it; leftovers are conveyor's actors
    still alive after it (Ray's own idle worker processes come and go as Ray likes)."""
    before = _actors()
    result = _time_window(make_loader, window)
    gc.collect()
    new = [psutil.Process(pid) for pid in _actors() - before]
    _, alive = psutil.wait_procs(new, timeout=_EXIT_GRACE_S)
    return dataclasses.replace(result, leaked_processes=len(alive))


def per_batch_note(processes: Row, remote: Row, batch_size: int) -> str:
    """The cost of Ray per batch: wall time from the two rows' samples/s, and CPU."""
    local_rate, remote_rate = processes.median(LOADER), remote.median(LOADER)
    if not local_rate or not remote_rate:
        return "cost of Ray per batch: not measured (a row failed)"
    local_us, remote_us = 1e6 * batch_size / local_rate, 1e6 * batch_size / remote_rate
    text = (
        f"through Ray: {remote_us - local_us:+,.0f} µs per batch ({remote_us:,.0f} against "
        f"{local_us:,.0f} with processes: {remote_us / local_us:.2f}x)"
    )
    for figure, what in (("main_cpu_ms_per_batch", "driver"), ("total_cpu_ms_per_batch", "all")):
        mine, theirs = remote.per_batch(LOADER, figure), processes.per_batch(LOADER, figure)
        if mine is not None and theirs is not None:
            text += f"; CPU per batch, {what}: {mine:.2f} ms against {theirs:.2f}"
    return text


def bytes_note(row: Row, sample_bytes: int, way: str) -> str:
    rate = row.median(LOADER)
    if not rate:
        return f"{way}: not measured"
    return f"{way}: {rate * sample_bytes / 1e6:,.0f} MB/s of batches"


RowRunner = Callable[[str, "dict[str, LoaderFactory]"], Row]


def run_remote_rows(
    spec: WorkloadSpec,
    window: WindowSpec,
    loader_class: Callable[..., Any],
    run: RowRunner,
    options: BenchOptions,
) -> list[Row]:
    """Run the rows (``run(config, factories)`` runs one and returns it) and note on the
    Ray rows what they cost against the processes' rows."""
    workers, size = spec.num_workers, spec.batch_size
    batches = window.warmup + window.max_batches
    decode = spec.make_dataset(batches * size, options.quick)
    images = ImageDataset(batches * IMAGE_BATCH)
    image_bytes = int(np.prod(ImageDataset.shape))
    common = {"num_workers": workers, "persistent_workers": spec.persistent_workers}

    def factory(dataset: Any, method: str, batch_size: int) -> dict[str, LoaderFactory]:
        # forkserver: this process runs Ray's threads, which fork would copy mid-flight.
        how = {"worker_method": "ray"} if method == "ray" else {"multiprocessing_context": method}
        return {LOADER: lambda: loader_class(dataset, batch_size=batch_size, **common, **how)}

    label = f"{workers} workers"
    with ray_cluster(cpus=max(2, workers + 1)) as where:
        local = run(f"decode, {label}, processes", factory(decode, "forkserver", size))
        remote = run(f"decode, {label}, Ray on {where}", factory(decode, "ray", size))
        shm = run(f"images, {label}, processes", factory(images, "forkserver", IMAGE_BATCH))
        store = run(f"images, {label}, Ray", factory(images, "ray", IMAGE_BATCH))
    remote.notes.append(per_batch_note(local, remote, size))
    shm.notes.append(bytes_note(shm, image_bytes, "shared memory"))
    store.notes.append(bytes_note(store, image_bytes, "Ray's object store"))
    return [local, remote, shm, store]
